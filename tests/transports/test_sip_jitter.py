"""The SIP bridge's adaptive jitter buffer (transports/sip/media/jitter.py): in-order release, loss
concealment, duplicates, wraparound, resyncs, the RFC 3550 jitter estimate, and the wait it
learns from the path's reordering (packets shuffled in real time are all heard; the wait decays
once the path is in order)."""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transports.sip.media import rtp
from transports.sip.media.jitter import JitterBuffer, JitterConfig

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
