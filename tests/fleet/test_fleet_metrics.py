"""The fleet's metrics: a node's registry read as the fleet reads it, counters kept across a
node's restart, and the fleet's exposition built from the directory's stats."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from wave_actors.fleet.directory import Directory, FleetFull
from wave_actors.fleet.metrics import FleetCollector, NodeReading, Totals, parse_node
from wave_actors.runtime.metrics import NodeMetrics


def node_text(beats=10, late=2, latencies=(0.1,) * 10, sessions=3, free=5) -> str:
    m = NodeMetrics()
    m.sessions.set(sessions)
    m.free_slots.set(free)
    m.beats.inc(beats)
    m.late_beats.inc(late)
    for x in latencies:
        m.beat_latency.observe(x)
    m.refusals.labels("capacity").inc(4)
    return generate_latest(m.registry).decode()


def test_a_nodes_registry_reads_back_as_a_reading():
    r = parse_node(node_text())
    assert (r.sessions, r.free_slots, r.beats, r.late_beats) == (3, 5, 10, 2)
    assert r.latency_count == 10 and abs(r.latency_sum_s - 1.0) < 1e-9
    assert r.refusals == {"capacity": 4}


def test_headroom_is_the_beat_less_the_mean_latency_since_the_last_reading():
    before = parse_node(node_text(latencies=(0.1,) * 10))
    after = parse_node(node_text(latencies=(0.1,) * 10 + (0.14,) * 10))
    assert abs(after.headroom_ms(before) - 20.0) < 1e-6          # 160 − 140 ms
    assert after.headroom_ms(after) is None                      # no beat in between
    assert after.headroom_ms(None) is None


def test_fleet_totals_keep_what_a_node_counted_before_its_restart():
    """Bug it catches: a fleet-wide late count read as the sum of the nodes' current counters
    falls back when a node restarts (its counters start again at 0)."""
    t = Totals()
    t.add("n0", NodeReading(beats=100, late_beats=3))
    t.add("n1", NodeReading(beats=50, late_beats=0))
    t.add("n0", NodeReading(beats=120, late_beats=4))
    t.add("n0", NodeReading(beats=7, late_beats=1))               # restarted
    assert (t.beats, t.late_beats) == (177, 5)


def test_the_fleet_exposition_has_fleet_and_per_node_series():
    d = Directory()
    d.join("node0", "tcp://a:1", 2)
    d.join("node1", "tcp://b:1", 2)
    for _ in range(3):
        d.place()
    d.drain("node1")
    while d.nodes["node0"].load.free:
        d.place()
    with pytest.raises(FleetFull):
        d.place()
    totals = Totals()
    totals.add("node0", NodeReading(beats=9, late_beats=1))
    registry = CollectorRegistry()
    registry.register(FleetCollector(d.stats, lambda: {"node0": NodeReading(beats=9,
                                                                            late_beats=1)},
                                     totals))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(generate_latest(registry).decode())
               for s in f.samples}
    assert samples[("wave_fleet_sessions", ())] == len(d.where) >= 3
    assert samples[("wave_fleet_free_slots", ())] == 0
    assert samples[("wave_fleet_nodes", (("state", "draining"),))] == 1
    assert samples[("wave_fleet_refusals_total", (("reason", "capacity"),))] == 1
    assert samples[("wave_fleet_node_sessions", (("node", "node1"),))] == \
        len(d.nodes["node1"].sessions) >= 1
    assert samples[("wave_fleet_node_draining", (("node", "node1"),))] == 1
    assert samples[("wave_fleet_node_late_beats_total", (("node", "node0"),))] == 1
    assert samples[("wave_fleet_late_beats_total", ())] == 1
