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
        self.snapshot_starts = Counter(
            "wave_snapshot_starts", "starts by prompt snapshot: hit (one copy), prefix_hit (a "
            "copy, then the rest prefilled), miss (prefilled)", ["how"], registry=r)
        self.snapshot_saves = Counter("wave_snapshot_saves", "prompt snapshots made",
                                      registry=r)
        self.snapshot_evictions = Counter("wave_snapshot_evictions",
                                          "prompt snapshots dropped for room", registry=r)
        self.snapshots_kept = Gauge("wave_snapshots_kept", "prompt snapshots held", registry=r)
        self.snapshot_bytes = Gauge("wave_snapshot_bytes", "device bytes the held prompt "
                                    "snapshots take", registry=r)
        self._snap_seen: dict = {}

    def snapshots(self, stats: dict | None) -> None:
        """The clock's snapshot index counts (`SnapshotIndex.describe`) into the metrics: its
        counts start again at zero with each clock incarnation, so a count below the last one
        seen is a new incarnation's."""
        if stats is None:
            return
        for key, counter in (("hits", self.snapshot_starts.labels("hit")),
                             ("prefix_hits", self.snapshot_starts.labels("prefix_hit")),
                             ("misses", self.snapshot_starts.labels("miss")),
                             ("saves", self.snapshot_saves),
                             ("evictions", self.snapshot_evictions)):
            now, seen = stats[key], self._snap_seen.get(key, 0)
            counter.inc(now - seen if now >= seen else now)
            self._snap_seen[key] = now
        self.snapshots_kept.set(stats["kept"])
        self.snapshot_bytes.set(stats["bytes"])

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
