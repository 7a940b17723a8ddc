"""The node's Prometheus totals of lost frames, by where a closed session lost them."""
from wave_actors.core.sched.jitter import SlotStats
from wave_actors.runtime.metrics import NodeMetrics


def _lost(m: NodeMetrics) -> dict:
    return {w: m.registry.get_sample_value("wave_frames_lost_total", {"where": w})
            for w in ("input_shed", "input_clock", "input_session", "output")}


def test_a_closed_sessions_lost_frames_are_split_by_where_they_were_lost():
    # Catches shed frames counted twice (as shed and again among the clock's other drops), or
    # a stale handle's missing slot stats failing the close.
    m = NodeMetrics()
    m.closed_lost(SlotStats(dropped=5, shed=2), session_drops=3, dropped_out=1)
    assert _lost(m) == {"input_shed": 2, "input_clock": 3, "input_session": 3, "output": 1}
    m.closed_lost(None, session_drops=1, dropped_out=0)
    assert _lost(m) == {"input_shed": 2, "input_clock": 3, "input_session": 4, "output": 1}
