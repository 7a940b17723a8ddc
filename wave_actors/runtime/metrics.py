"""Prometheus metrics of a node. Labels carry codes and reasons, never session ids (unbounded
cardinality would grow the registry with every call)."""
from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Buckets dense around the 160 ms deadline, where the question "late or not" is decided.
LATENCY_BUCKETS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.14, 0.15, 0.155, 0.16, 0.165,
                   0.17, 0.18, 0.2, 0.25, 0.32, 0.5, 1.0)
OPEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.16, 0.2, 0.25, 0.3, 0.5, 1.0, 2.0, 5.0)
OPEN_PHASES = ("admit", "start", "answer")
OPENS_KEPT = 4096


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
        self.open_phase = Histogram(
            "wave_open_phase_seconds", "an open's time in the node, by phase: admit (read to "
            "its slot held), start (to its start planned into a beat), answer (to `opened` "
            "sent)", ["phase"], buckets=OPEN_BUCKETS, registry=r)
        # the last opens' phases, seconds (admit, start, answer): what a bench run reports
        self.recent_opens: deque[tuple[float, float, float]] = deque(maxlen=OPENS_KEPT)
        self.closed = Counter("wave_sessions_closed", "sessions closed, by reason", ["reason"],
                              registry=r)
        self.frames_lost = Counter(
            "wave_frames_lost", "80 ms frames of closed sessions never heard or never delivered "
            "(the sums of their closed.stats): input_shed (shed to bring the jitter delay back "
            "down), input_clock (past the jitter buffer's bound, or queued at close), "
            "input_session (duplicates, skipped seqs, bad payloads, flood, past --input-hold), "
            "output (not delivered to the client)", ["where"], registry=r)
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

    def closed_lost(self, slot, session_drops: int, dropped_out: int) -> None:
        """A closed session's lost frames by where they were lost (`slot`: the clock's
        `SlotStats`, None for a stale handle)."""
        dropped, shed = (slot.dropped, slot.shed) if slot else (0, 0)
        for where, n in (("input_shed", shed), ("input_clock", dropped - shed),
                         ("input_session", session_drops), ("output", dropped_out)):
            self.frames_lost.labels(where).inc(n)

    def open_timed(self, phases: tuple[float, float, float]) -> None:
        for name, seconds in zip(OPEN_PHASES, phases):
            self.open_phase.labels(name).observe(seconds)
        self.recent_opens.append(phases)

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
