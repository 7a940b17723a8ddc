"""Prometheus metrics of a node. Labels carry codes and reasons, never session ids (unbounded
cardinality would grow the registry with every call)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Buckets dense around the 160 ms deadline, where the question "late or not" is decided.
LATENCY_BUCKETS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.14, 0.15, 0.155, 0.16, 0.165,
                   0.17, 0.18, 0.2, 0.25, 0.32, 0.5, 1.0)


class NodeMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.sessions = Gauge("wave_sessions", "live sessions", registry=r)
        self.free_slots = Gauge("wave_free_slots", "free session slots", registry=r)
        self.beat_latency = Histogram("wave_beat_latency_seconds",
                                      "beat release to outputs routed", buckets=LATENCY_BUCKETS,
                                      registry=r)
        self.beats = Counter("wave_beats", "beats run", registry=r)
        self.late_beats = Counter("wave_late_beats", "beats that missed the 160 ms deadline",
                                  registry=r)
        self.underruns = Counter("wave_underruns", "input frames replaced by silence", registry=r)
        self.drops = Counter("wave_dropped", "audio dropped, by reason", ["reason"], registry=r)
        self.refusals = Counter("wave_refusals", "sessions refused, by reason", ["reason"],
                                registry=r)
        self.errors = Counter("wave_errors", "error replies, by code", ["code"], registry=r)
        self.opened = Counter("wave_sessions_opened", "sessions opened", registry=r)
        self.closed = Counter("wave_sessions_closed", "sessions closed, by reason", ["reason"],
                              registry=r)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
