"""The fleet's Prometheus metrics: per node and fleet-wide.

Each node serves its own registry (`wave_actors/runtime/metrics.py`) on its host's loopback;
its node actor reads it there (`read_node`) and hands the reading to the fleet's watch over
Ray's control plane, so one scrape of the fleet's endpoint sees every node without Prometheus
reaching each host. The directory's counts (placements, closes, refusals by reason, what each
node holds) come from its last `stats()`. Everything a scrape returns was read by the watch
(every half second), so a scrape never waits on Ray or on a node.
"""
from __future__ import annotations

import urllib.request
from dataclasses import dataclass, field
from typing import Callable

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

BEAT_MS = 160.0


@dataclass
class NodeReading:
    """What the fleet reads of one node's registry."""
    sessions: float = 0.0
    free_slots: float = 0.0
    beats: float = 0.0
    late_beats: float = 0.0
    latency_sum_s: float = 0.0
    latency_count: float = 0.0
    refusals: dict[str, float] = field(default_factory=dict)
    # What the node said of its sessions (its `--report-sessions` lines: ("opened" or
    # "closed", id)) past what the watch last acknowledged; `events_mark` (the node's
    # incarnation, the count through the last of them) is what the watch hands back.
    events: list[tuple[str, str]] = field(default_factory=list)
    events_mark: tuple[int, int] = (0, 0)

    def headroom_ms(self, before: "NodeReading | None") -> float | None:
        """The beat's time left, from the mean beat latency since `before` (None: no beat ran
        in between, or the node restarted)."""
        if before is None:
            return None
        beats = self.latency_count - before.latency_count
        if beats <= 0:
            return None
        return BEAT_MS - 1000.0 * (self.latency_sum_s - before.latency_sum_s) / beats


_SAMPLES = {"wave_sessions": "sessions", "wave_free_slots": "free_slots",
            "wave_beats_total": "beats", "wave_late_beats_total": "late_beats",
            "wave_beat_latency_seconds_sum": "latency_sum_s",
            "wave_beat_latency_seconds_count": "latency_count"}


def parse_node(text: str) -> NodeReading:
    r = NodeReading()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in _SAMPLES:
                setattr(r, _SAMPLES[s.name], float(s.value))
            elif s.name == "wave_refusals_total":
                r.refusals[s.labels.get("reason", "")] = float(s.value)
    return r


def read_node(port: int, timeout_s: float = 0.5) -> NodeReading:
    """A node's registry, read on its own host."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as r:
        return parse_node(r.read().decode())


class Totals:
    """Fleet-wide counters that survive a node's restart: a node's counters start again at 0
    with each incarnation, so what it counted before is kept here."""

    def __init__(self):
        self._last: dict[str, NodeReading] = {}
        self.beats = 0.0
        self.late_beats = 0.0

    def add(self, name: str, now: NodeReading) -> None:
        before = self._last.get(name)
        restarted = before is None or now.beats < before.beats
        self.beats += now.beats - (0 if restarted else before.beats)
        self.late_beats += now.late_beats - (0 if restarted else before.late_beats)
        self._last[name] = now


class FleetCollector:
    """A Prometheus collector over the watch's last directory stats and node readings."""

    def __init__(self, stats: Callable[[], dict], readings: Callable[[], dict[str, NodeReading]],
                 totals: Totals):
        self.stats, self.readings, self.totals = stats, readings, totals

    def collect(self):
        s, readings = self.stats(), self.readings()
        nodes = s.get("nodes", {})
        state = GaugeMetricFamily("wave_fleet_nodes", "nodes, by state", labels=["state"])
        for name in ("alive", "quiet", "draining", "lost"):
            state.add_metric([name], sum(1 for n in nodes.values() if _state(n) == name))
        yield state
        yield GaugeMetricFamily("wave_fleet_sessions", "calls placed and not yet closed",
                                value=s.get("sessions", 0))
        yield GaugeMetricFamily("wave_fleet_free_slots", "free slots on nodes taking calls",
                                value=s.get("free_slots", 0))
        for key, doc in (("placements", "calls placed"), ("closes", "calls closed"),
                         ("given_back", "placements a node refused"),
                         ("lost_sessions", "calls ended by their node's loss"),
                         ("taken_in", "calls a node opened that the directory had not "
                                      "placed (late opens, a directory restart)")):
            yield CounterMetricFamily(f"wave_fleet_{key}", doc, value=s.get(key, 0))
        refused = CounterMetricFamily("wave_fleet_refusals", "calls no node could take, by "
                                      "reason", labels=["reason"])
        for reason, n in sorted(s.get("refusals", {}).items()):
            refused.add_metric([reason], n)
        yield refused
        yield CounterMetricFamily("wave_fleet_beats", "beats run by every node",
                                  value=self.totals.beats)
        yield CounterMetricFamily("wave_fleet_late_beats", "late beats of every node",
                                  value=self.totals.late_beats)
        yield from self._per_node(nodes, readings)

    @staticmethod
    def _per_node(nodes: dict, readings: dict[str, NodeReading]):
        g = {key: GaugeMetricFamily(f"wave_fleet_node_{key}", doc, labels=["node"])
             for key, doc in (("sessions", "calls the directory placed on the node"),
                              ("free_slots", "the node's free slots"),
                              ("alive", "1 until the node is lost"),
                              ("quiet", "1 while the node's last reading went unanswered"),
                              ("draining", "1 while the node takes no new call"),
                              ("incarnation", "the node's incarnation: one more each restart"),
                              ("headroom_ms", "the beat's time left, last reported"))}
        c = {key: CounterMetricFamily(f"wave_fleet_node_{key}", doc, labels=["node"])
             for key, doc in (("beats", "beats run by this incarnation"),
                              ("late_beats", "late beats of this incarnation"))}
        refused = CounterMetricFamily("wave_fleet_node_refusals", "opens the node refused, "
                                      "by reason", labels=["node", "reason"])
        for name, n in sorted(nodes.items()):
            for key, value in (("sessions", n["used"]), ("free_slots", n["free"]),
                               ("alive", n["alive"]), ("quiet", n.get("quiet", False)),
                               ("draining", n["draining"]),
                               ("incarnation", n["incarnation"]),
                               ("headroom_ms", n["headroom_ms"])):
                g[key].add_metric([name], float(value))
            r = readings.get(name)
            if r is not None:
                c["beats"].add_metric([name], r.beats)
                c["late_beats"].add_metric([name], r.late_beats)
                for reason, v in sorted(r.refusals.items()):
                    refused.add_metric([name, reason], v)
        yield from g.values()
        yield from c.values()
        yield refused


def _state(node: dict) -> str:
    if not node["alive"]:
        return "lost"
    if node.get("quiet"):
        return "quiet"
    return "draining" if node["draining"] else "alive"


def serve(collector: FleetCollector, port: int, addr: str = "127.0.0.1") -> None:
    registry = CollectorRegistry()
    registry.register(collector)
    start_http_server(port, addr=addr, registry=registry)
