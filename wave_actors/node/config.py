"""What a node is configured with (`NodeConfig`, checked when made) and what it counts
(`NodeCounters`), and the `closed` stats a session ends with."""
from __future__ import annotations

from dataclasses import dataclass, field

from wave_actors.core.contract import SessionSpec
from wave_actors.core.sched.clock_policy import ClockPolicy
from wave_actors.core.sched.start_policy import StartPolicy
from wave_actors.node.flood import FloodPolicy


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    bind: str = "tcp://127.0.0.1:5555"
    max_sessions: int = 8
    clock_policy: ClockPolicy = field(default_factory=ClockPolicy)
    start_policy: StartPolicy | None = None     # None: GuardedStarts (start work only where it fits)
    idle_timeout_s: float = 10.0         # a session that hears nothing of its own this long ends
    heartbeat_s: float = 1.0             # a client sends something at least this often
    heartbeat_liveness: int = 3          # heartbeats missed before its sessions are detached
    resume_grace_s: float = 5.0          # a detached session waits this long for `resume`
    start_timeout_s: float = 60.0        # an admitted session's start (prefill) must end by then
    drain_grace_s: float = 1.0           # a drain refuses opens at least this long (racing clients)
    curve_keys: str | None = None        # directory: server.key_secret + clients/*.key
    metrics_port: int | None = None
    clock_endpoint: str = "inproc://wave-clock"
    flood: FloodPolicy = field(default_factory=FloodPolicy)
    keep_records: bool = True            # keep every beat's record (bench, tests)
    # Session workers: 0 runs every session actor on this process's loop, beside the beat
    # clock; N > 0 runs them in N worker processes (`sessions/hosts.py`), the clock's loop then
    # only admits, routes and beats.
    workers: int = 0
    input_hold_s: float = 60.0           # input a session may send ahead of real time
    # Messages the socket queues for one client before the front queues the rest itself, in
    # order (`outbound.py`): a larger pipe only delays seeing that a client does not read.
    send_hwm: int = 10_000
    # Prompts started before the node reads its socket (`warm.py`), so their first callers
    # start from a snapshot: by default the prompt of a caller who sends no instructions.
    warm_prompts: tuple[SessionSpec, ...] = (SessionSpec(),)
    warm_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.input_hold_s <= 0:
            raise ValueError("input_hold_s must be > 0")
        if self.workers < 0:
            raise ValueError("workers must be >= 0 (0: sessions on the node's own loop)")
        if min(self.idle_timeout_s, self.heartbeat_s, self.resume_grace_s) <= 0 \
                or self.heartbeat_liveness < 1:
            raise ValueError("idle_timeout_s, heartbeat_s and resume_grace_s must be > 0 and "
                             "heartbeat_liveness >= 1")

    @property
    def silence_limit_s(self) -> float:
        """A client heard from nothing for this long is taken to be gone."""
        return self.heartbeat_s * self.heartbeat_liveness


def close_stats(slot, worker_drops: int, frames_sent: int, dropped_out: int) -> dict:
    """`closed.stats` from the clock's slot stats (None: a stale handle) and the session's
    side: input frames lost before the clock, audio messages sent and not taken."""
    dropped_in = (slot.dropped if slot else 0) + worker_drops
    return {"frames_in": slot.frames_in if slot else 0, "frames_out": frames_sent,
            "underruns": slot.underruns if slot else 0, "dropped": dropped_in + dropped_out,
            "late_beats": slot.late_beats if slot else 0,
            "dropped_in": dropped_in, "dropped_out": dropped_out}


@dataclass
class NodeCounters:
    errors: dict = field(default_factory=dict)
    stale: int = 0                      # messages naming a session handle no longer current
    refusals: dict = field(default_factory=dict)
    flood_drops: int = 0
    opened: int = 0
    closed: int = 0
    crashed: int = 0
    superseded: int = 0                 # messages read from a connection already replaced
    held_lost: int = 0                  # messages for detached sessions past outbound.HELD_MAX
    stale_rows: int = 0                 # beat outputs a worker read after they were refilled
