"""RTP header (RFC 3550), the playout buffer and the pacer (the jitter buffer:
`test_sip_jitter.py`)."""
import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transports.sip.media import pcap, rtp
from transports.sip.media.pacer import Playout, PlayoutConfig, ticks

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
