"""RTP header (RFC 3550), the adaptive jitter buffer, the playout buffer and the pacer."""
import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transports.sip import pcap, rtp
from transports.sip.jitter import JitterBuffer, JitterConfig
from transports.sip.pacer import Playout, PlayoutConfig, ticks

# --------------------------------------------------------------------------- RTP header


def test_rtp_known_bytes():
    pkt = rtp.RtpPacket(0, 0x1234, 0xDEADBEEF, 0xCAFEBABE, b"\xff" * 4, marker=True)
    data = pkt.pack()
    assert data[:12] == bytes.fromhex("80801234deadbeefcafebabe")
    assert rtp.parse(data) == pkt


@settings(max_examples=300, deadline=None)
@given(pt=st.integers(0, 127), seq=st.integers(0, 0xFFFF), ts=st.integers(0, 2**32 - 1),
       ssrc=st.integers(0, 2**32 - 1), payload=st.binary(max_size=200), marker=st.booleans(),
       csrc=st.lists(st.integers(0, 2**32 - 1), max_size=15),
       ext=st.none() | st.tuples(st.integers(0, 0xFFFF), st.binary(max_size=12).map(
           lambda b: b + bytes(-len(b) % 4))),
       padding=st.integers(0, 255))
def test_rtp_roundtrip_property(pt, seq, ts, ssrc, payload, marker, csrc, ext, padding):
    pkt = rtp.RtpPacket(pt, seq, ts, ssrc, payload, marker, tuple(csrc), ext, padding)
    assert rtp.parse(pkt.pack()) == pkt


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=100))
def test_rtp_random_bytes_raise_only_rtp_error(data):
    try:
        rtp.parse(data)
    except rtp.RtpError:
        pass


@pytest.mark.parametrize("data", [b"", b"\x80" * 11, b"\x40" + bytes(11),
                                  b"\x8f" + bytes(11), b"\x90" + bytes(13),
                                  b"\xa0" + bytes(11) + b"\x05"])
def test_rtp_malformed(data):
    with pytest.raises(rtp.RtpError):
        rtp.parse(data)


def test_rtcp_is_recognised():
    assert rtp.is_rtcp(bytes([0x80, 200]) + bytes(6))
    assert rtp.is_rtcp(bytes([0x81, 201, 0, 7]) + bytes(28))        # RR with one report block
    assert not rtp.is_rtcp(rtp.RtpPacket(0, 1, 2, 3, b"x").pack())


@pytest.mark.parametrize("data", [bytes([0x80, 200]) + bytes(5),      # 7 bytes: shorter than a header
                                  bytes([0x80, 200]) + bytes(7),      # not whole 32-bit words
                                  bytes([0x80, 200, 0, 2]) + bytes(4),  # length says 12 bytes, has 8
                                  bytes([0x40, 200]) + bytes(6)])     # version 1
def test_rtcp_lookalikes_are_not_rtcp(data):
    assert not rtp.is_rtcp(data)


@given(st.binary(max_size=7))
def test_short_datagrams_are_never_rtcp(data):
    # invariant: garbage shorter than an RTCP header is counted as bad RTP, never swallowed as RTCP
    assert not rtp.is_rtcp(data)


def test_sender_sequence_timestamps_marker_and_random_ssrc():
    s = rtp.RtpSender(0, seq=0xFFFE, timestamp=2**32 - 160)
    pkts = [rtp.parse(s.packet(b"\xff" * 160, 160)) for _ in range(3)]
    assert [p.seq for p in pkts] == [0xFFFE, 0xFFFF, 0]
    assert [p.timestamp for p in pkts] == [2**32 - 160, 0, 160]
    assert [p.marker for p in pkts] == [True, False, False]
    s.skip(160)
    assert rtp.parse(s.packet(b"x", 1)).timestamp == 480
    assert len({rtp.RtpSender(0).ssrc for _ in range(8)}) == 8


def test_pcap_roundtrip(tmp_path):
    pkts = [(i * 0.02, rtp.RtpPacket(0, i, 160 * i, 9, bytes([i]) * 160).pack())
            for i in range(5)]
    pcap.write(tmp_path / "a.pcap", pkts)
    back = pcap.read(tmp_path / "a.pcap")
    assert [p for _, p in back] == [p for _, p in pkts]
    assert [round(t, 6) for t, _ in back] == [round(t, 6) for t, _ in pkts]


# --------------------------------------------------------------------------- jitter buffer

CFG = JitterConfig(start_wait=0.0)      # the classic buffer: the wait learnt from losses alone


def _pkt(seq: int, ssrc: int = 7, n: int = 160) -> rtp.RtpPacket:
    return rtp.RtpPacket(0, seq & 0xFFFF, (1000 + 160 * seq) & 0xFFFFFFFF, ssrc,
                         bytes([seq & 0xFF]) * n)


def _run(arrivals, cfg=CFG, drain=True):
    """Push (time, packet) in order, popping after each; returns (outs, buffer)."""
    jb, outs = JitterBuffer(cfg), []
    for t, pkt in arrivals:
        outs += jb.pop(t)
        jb.push(pkt, t)
        outs += jb.pop(t)
    if drain:
        outs += jb.drain()
    return outs, jb


def test_in_order_packets_leave_at_once():
    jb = JitterBuffer(CFG)
    for i in range(5):
        jb.push(_pkt(i), i * 0.02)
        (out,) = jb.pop(i * 0.02)
        assert out.payload == bytes([i]) * 160 and not out.lost
    assert jb.stats.played == 5 and jb.depth == 0


def test_reordering_is_absorbed():
    order = [0, 2, 1, 3, 5, 4, 6]
    outs, jb = _run([(i * 0.02, _pkt(s)) for i, s in enumerate(order)])
    assert [o.payload[0] for o in outs] == list(range(7))
    assert jb.stats.reordered == 2 and jb.stats.lost == 0


def test_loss_is_concealed_after_the_wait():
    jb = JitterBuffer(CFG)
    jb.push(_pkt(0), 0.0)
    jb.pop(0.0)
    jb.push(_pkt(2), 0.04)
    assert jb.pop(0.04) == [] and jb.next_deadline() == pytest.approx(0.04 + CFG.min_wait)
    out = jb.pop(0.04 + CFG.min_wait)
    assert [(o.lost, o.payload) for o in out] == [(True, b"\xff" * 160), (False, b"\x02" * 160)]
    assert jb.stats.lost == 1 and jb.stats.concealed == 1
    jb.push(_pkt(1), 0.2)                     # arrives after it was given up on
    assert jb.stats.late == 1 and jb.pop(0.2) == []
    assert jb.stats.wait_ms > CFG.min_wait * 1000      # a late packet grows the wait


def test_duplicates_are_dropped():
    outs, jb = _run([(0.0, _pkt(0)), (0.01, _pkt(0)), (0.02, _pkt(2)), (0.03, _pkt(2)),
                     (0.04, _pkt(1))])
    assert [o.payload[0] for o in outs] == [0, 1, 2]
    assert jb.stats.duplicate == 2


def test_sequence_wraparound():
    seqs = [0xFFFD, 0xFFFE, 0, 0xFFFF, 1]
    outs, jb = _run([(i * 0.02, _pkt(s)) for i, s in enumerate(seqs)])
    assert [o.seq & 0xFFFF for o in outs] == [0xFFFD, 0xFFFE, 0xFFFF, 0, 1]
    assert jb.stats.lost == 0 and jb.stats.reordered == 1


def test_far_jump_needs_two_packets_then_resyncs():
    arrivals = [(0.0, _pkt(0)), (0.02, _pkt(1)), (0.04, _pkt(30000)), (0.06, _pkt(2)),
                (0.08, _pkt(9000, ssrc=8)), (0.10, _pkt(9001, ssrc=8)), (0.12, _pkt(9002, 8))]
    outs, jb = _run(arrivals)
    assert [o.payload[0] for o in outs] == [0, 1, 2] + [9000 & 0xFF, 9001 & 0xFF, 9002 & 0xFF]
    assert jb.stats.jumped == 1 and jb.stats.resyncs == 1 and jb.stats.lost == 0


def test_full_buffer_gives_up_its_gap():
    cfg = JitterConfig(capacity=4, max_wait=10.0, min_wait=10.0)
    outs, jb = _run([(0.0, _pkt(0))] + [(0.001 * i, _pkt(i)) for i in range(2, 7)],
                    cfg, drain=False)
    assert jb.stats.forced == 1 and jb.stats.lost == 1
    assert [o.seq - outs[0].seq for o in outs] == list(range(7))


def test_concealment_follows_timestamps_and_is_bounded():
    cfg = JitterConfig(max_conceal=2)
    outs, jb = _run([(0.0, _pkt(0)), (0.1, _pkt(5))], cfg)
    lost = [o for o in outs if o.lost]
    assert len(lost) == 4 and jb.stats.lost == 4 and jb.stats.concealed == 2
    assert [len(o.payload or b"") for o in lost] == [160, 160, 0, 0]
    outs, jb = _run([(0.0, _pkt(0, n=100)), (0.1, _pkt(2, n=100))])   # ts says 220 missing
    assert [len(o.payload) for o in outs] == [100, 220, 100]


def test_jitter_estimate_tracks_rfc3550():
    jb = JitterBuffer(CFG)
    rng = random.Random(1)
    for i in range(400):
        jb.push(_pkt(i), i * 0.02 + rng.uniform(0, 0.01))
        jb.pop(i * 0.02 + 0.02)
    assert 1.0 < jb.stats.jitter_ms < 6.0       # E|D| of U(0,10ms) differences is 3.3 ms
    assert jb.stats.wait_ms == pytest.approx(max(CFG.min_wait * 1000, 4 * jb.stats.jitter_ms),
                                             rel=0.2)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 150), start=st.integers(0, 0xFFFF), loss=st.floats(0, 0.3),
       dup=st.floats(0, 0.2), spread=st.floats(0, 0.3), seed=st.integers(0, 2**32))
def test_invariant_every_packet_played_once_in_order_or_counted(n, start, loss, dup, spread,
                                                                seed):
    """Whatever the loss, reordering (arrival delays up to `spread`) and duplication: sequence
    numbers leave strictly increasing and contiguous; every payload leaves at most once and is
    the payload of its own sequence number; every arrival is played, late, duplicate or still
    buffered; every missing number inside the output range is counted lost."""
    rng = random.Random(seed)
    sent = [0] + [i for i in range(1, n) if rng.random() >= loss]
    arrivals = [(i * 0.02 + rng.uniform(0, spread), _pkt(start + i)) for i in sent]
    arrivals += [(t + rng.uniform(0, 0.1), p) for t, p in arrivals if rng.random() < dup]
    arrivals.sort(key=lambda a: a[0])
    outs, jb = _run(arrivals, JitterConfig(max_jump=1000))
    s = jb.stats
    seqs = [o.seq for o in outs]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))            # in order, contiguous
    played = [o for o in outs if not o.lost]
    assert len({o.seq for o in played}) == len(played) == s.played
    assert s.lost == len(outs) - len(played)
    assert s.received == len(arrivals)
    assert s.received == s.played + s.late + s.duplicate + s.jumped + jb.depth and jb.depth == 0
    first = arrivals[0][1].seq                  # the stream starts at the first arrival
    for o in played:
        assert o.payload == _pkt(first + o.seq - seqs[0]).payload
    assert {(first + o.seq - seqs[0]) & 0xFFFF for o in played} <= \
        {(start + i) & 0xFFFF for i in sent}


@settings(max_examples=100, deadline=None)
@given(st.sets(st.integers(0, 58), max_size=20))
def test_adjacent_swaps_within_min_wait_lose_nothing(swaps):
    order, touched = list(range(60)), set()
    for i in sorted(swaps):
        if i not in touched and i + 1 not in touched and i > 0:
            order[i], order[i + 1] = order[i + 1], order[i]
            touched |= {i, i + 1}
    arrivals = [(k * 0.02, _pkt(s)) for k, s in enumerate(order)]
    outs, jb = _run(arrivals, drain=False)
    assert [o.payload[0] for o in outs] == list(range(60))
    assert jb.stats.lost == 0 and jb.stats.reordered == len(touched) // 2


def _real_time(arrivals, cfg=JitterConfig(), tick=0.005):
    """Push (time, packet) in time order with a pop every `tick` as a call's timer does, and
    when each arrives; then drain. Returns (outs, buffer)."""
    jb, outs, t = JitterBuffer(cfg), [], 0.0
    for at, pkt in sorted(arrivals, key=lambda a: a[0]):
        while t < at:
            outs += jb.pop(t)
            t += tick
        jb.push(pkt, at)
        outs += jb.pop(at)
    return outs + jb.drain(), jb


def _blocks_of_4(n: int, seed: int) -> list[int]:
    rng, order = random.Random(seed), []
    for b in range(0, n, 4):
        block = list(range(b, min(b + 4, n)))
        rng.shuffle(block)
        order += block
    return order


@pytest.mark.parametrize("seed", range(4))
def test_packets_shuffled_within_blocks_of_4_are_all_heard(seed):
    """A path that shuffles packets within blocks of 4 (80 ms), sent in real time: every packet
    is heard, from the call's first gap on. Bug caught: a wait learnt only from losses and
    jitter, which loses packets before it grows."""
    order = [0] + [1 + s for s in _blocks_of_4(399, seed)]    # the first packet starts the stream
    arrivals = [(k * 0.02, _pkt(s)) for k, s in enumerate(order)]
    outs, jb = _real_time(arrivals)
    assert [o.payload[0] for o in outs] == [i & 0xFF for i in range(400)]
    assert jb.stats.lost == jb.stats.late == 0 and jb.stats.played == 400


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 150), delays=st.lists(st.floats(0, 0.16), min_size=150, max_size=150),
       start=st.integers(0, 0xFFFF))
def test_any_permutation_within_the_playout_window_loses_nothing(n, delays, start):
    """Packets sent every 20 ms, each arriving up to 160 ms after it was sent (so in any order
    that window allows; the first one first: an RTP stream starts at the first packet that
    arrives, its random first number says nothing of any before it): every one is played in
    order, none lost or late. Bug caught: a gap given up before the path's reordering is
    learnt."""
    arrivals = [(0.0, _pkt(start))] + [(i * 0.02 + delays[i], _pkt(start + i))
                                        for i in range(1, n)]
    outs, jb = _real_time(arrivals, JitterConfig(max_jump=1000))
    assert jb.stats.lost == 0 and jb.stats.late == 0 and jb.stats.played == n
    assert [o.payload for o in outs] == [_pkt(start + i).payload for i in range(n)]


def test_after_a_resync_a_gap_waits_as_long_as_its_deadline_says():
    """Bug caught: a resync's drain (time +inf) that moved the buffer's clock, so the deadline
    a call's timer waits for came before the time `pop` holds the gap to (a timer that fires
    at once, again and again)."""
    jb = JitterBuffer(JitterConfig())
    for i, (t, pkt) in enumerate([(0.0, _pkt(0)), (0.02, _pkt(9000, ssrc=8)),
                                  (0.04, _pkt(9001, ssrc=8)), (0.06, _pkt(9003, ssrc=8))]):
        jb.push(pkt, t)
        jb.pop(t)
    deadline = jb.next_deadline()
    assert deadline is not None and deadline > 0.06
    assert jb.pop(deadline - 0.001) == []
    assert [o.lost for o in jb.pop(deadline)] == [True, False]


def test_the_wait_returns_to_the_floor_once_the_path_stops_reordering():
    """The reach decays: a minute of in-order packets brings a gap's wait back near
    `min_wait`, so an in-order path's losses cost little delay."""
    jb = JitterBuffer(JitterConfig())
    assert jb.stats.wait_ms == pytest.approx(200)
    for i in range(3000):
        jb.push(_pkt(i), i * 0.02)
        jb.pop(i * 0.02)
    assert jb.stats.wait_ms < 50


# --------------------------------------------------------------------------- playout


def test_playout_smooths_beats_into_packets():
    p = Playout(PlayoutConfig())
    assert p.take() is None                       # nothing before the first audio
    frames = [bytes([k]) * 640 for k in range(4)]
    out = []
    for beat in range(2):                         # two 80 ms frames per 160 ms beat
        p.push(frames[2 * beat])
        p.push(frames[2 * beat + 1])
        out += [p.take() for _ in range(8)]
    assert b"".join(out) == b"".join(frames)
    assert p.stats.underruns == 0 and p.stats.packets_out == 16


def test_playout_underrun_sends_silence_and_raises_prebuffer():
    p = Playout(PlayoutConfig(prebuffer_ms=40))
    p.push(b"\x01" * 320)
    assert p.take() == b"\x01" * 160 and p.take() == b"\x01" * 160
    assert p.take() == b"\xff" * 160 and p.stats.underruns == 1
    assert p.stats.prebuffer_ms == 60
    p.push(b"\x02" * 320)                          # 40 ms < the new 60 ms prebuffer
    assert p.take() == b"\xff" * 160 and p.stats.silence_out == 2
    p.push(b"\x03" * 160)
    assert p.take() == b"\x02" * 160


def test_playout_is_bounded():
    p = Playout(PlayoutConfig(capacity_ms=100))
    p.push(bytes(range(256)) * 10)
    assert p.depth_ms == 100 and p.stats.dropped_bytes == 2560 - 800


# --------------------------------------------------------------------------- pacer


class VirtualClock:
    """Time advances only in sleep; each wake-up comes `lateness()` seconds after its due time."""

    def __init__(self, lateness=lambda: 0.0):
        self.t, self.lateness = 1000.0, lateness

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds + self.lateness()
        await asyncio.sleep(0)


async def _sends(clock, n, playout=None, max_catchup=3):
    """Drive the pacer like Call._tick_loop; returns [(send time, parsed packet)]."""
    sender, playout = rtp.RtpSender(0), playout or Playout(PlayoutConfig(prebuffer_ms=40))
    out, beat = [], 0
    gen = ticks(clock, 0.02, max_catchup)
    for k in range(n):
        skipped = await gen.__anext__()
        if skipped and playout.started:
            playout.stats.skipped_ticks += skipped
            sender.skip(skipped * 160)
        while clock.now() >= 1000.0 + 0.16 * beat:     # the node's beat: 2 frames at once
            playout.push(b"\x11" * 1280)
            beat += 1
        payload = playout.take()
        if payload is not None:
            out.append((clock.now(), rtp.parse(sender.packet(payload, 160))))
    return out, playout


def test_pacer_is_drift_free_with_jittery_wakeups():
    rng = random.Random(3)
    clock = VirtualClock(lambda: rng.uniform(0, 0.008))
    sends, playout = asyncio.run(_sends(clock, 1000))
    times = [t for t, _ in sends]
    # tick k leaves within [due, due + 8 ms]: errors never accumulate over 20 s
    for k, t in enumerate(times):
        due = 1000.0 + 0.02 * (k + 1 + (1000 - len(times)))
        assert 0 <= t - due < 0.0081
    pkts = [p for _, p in sends]
    assert all((b.seq - a.seq) & 0xFFFF == 1 for a, b in zip(pkts, pkts[1:]))
    assert all((b.timestamp - a.timestamp) & 0xFFFFFFFF == 160 for a, b in zip(pkts, pkts[1:]))
    assert pkts[0].marker and not any(p.marker for p in pkts[1:])
    assert playout.stats.underruns == 0


def test_pacer_skips_ticks_after_a_stall_but_timestamps_follow_real_time():
    stalls = iter([0.0] * 10 + [0.2] + [0.0] * 100)
    clock = VirtualClock(lambda: next(stalls))
    sends, playout = asyncio.run(_sends(clock, 60, max_catchup=3))
    pkts = [p for _, p in sends]
    span_ts = (pkts[-1].timestamp - pkts[0].timestamp) & 0xFFFFFFFF
    span_t = sends[-1][0] - sends[0][0]
    assert playout.stats.skipped_ticks > 0
    assert abs(span_ts / 8000 - span_t) < 0.021          # RTP time still equals wall time
    assert all((b.seq - a.seq) & 0xFFFF == 1 for a, b in zip(pkts, pkts[1:]))
