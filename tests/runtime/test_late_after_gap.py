"""A message that arrives after the session gave up waiting for it is counted once.

The session's reorder buffer waits (at most `MAX_GAP_WAIT_S`) for a missing seq, then skips it
and counts it lost at an estimate. When the message comes after all, it is dropped (its turn
has passed) and its real size replaces the estimate: `closed` counts every frame sent once,
heard or dropped.
"""
from tests.nodekit import VirtualNode, coded_frame
from wave_actors.core.reorder import MAX_GAP_WAIT_S
from wave_actors.core.sched.start_policy import EagerStarts


def test_a_message_later_than_its_gaps_wait_is_counted_once_not_twice():
    """Bug it catches: the late message counted as a seq gap when skipped and again as a stale
    message when it arrives (four frames reported for three sent)."""
    vn = VirtualNode(1, start_policy=EagerStarts())
    try:
        cs = vn.run(vn.client.open("late", sample_rate=16000, format="pcm_f32le"))
        actor = vn.node.sessions[(vn.client.identity, "late")]
        vn.run(cs.send_audio(coded_frame(1, 0), seq=0))
        vn.run(cs.send_audio(coded_frame(1, 2), seq=2))
        vn.settle(2 * MAX_GAP_WAIT_S)                   # seq 1 is given up on
        assert actor.counters.seq_gaps == 1
        vn.run(cs.send_audio(coded_frame(1, 1), seq=1))  # ... and comes after all
        vn.settle(0.01)
        assert actor.counters.after_gap == 1 and actor.counters.duplicates == 0
        vn.run(cs.send_audio(coded_frame(1, 1), seq=1))  # a true duplicate stays one
        vn.settle(0.01)
        assert actor.counters.duplicates == 1
        stats = vn.run(cs.close()).stats
        assert stats["frames_in"] + stats["dropped_in"] == 3 + 1, stats
    finally:
        vn.close()
