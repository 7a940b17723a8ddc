"""When a beat may also run session-start work (prompt prefill, talker warm-up chunks).

A start step (one bounded chunk of prompt and warm-up for a group of starting sessions) runs
eagerly after the live sessions' frames, in the same beat, so its whole cost lands on every live
session's latency. The budget runs as many steps as fit, with the beat's live frames and a
margin, in the time the beat has left before its deadline (`time_left_s`, from the clock: 160 ms
less how late the beat began and the clock's own routing after the backend returns). A beat that
began behind schedule therefore runs no start work, and start work never adds to a backlog; a
light beat runs several steps, so a burst of opens uses the idle part of the beats.

Costs are what this device measured: the live cost per live count (smoothed), a step's as the
largest of the recent ones (its cost varies with its rows and prompt part, and an underestimate
makes a live beat late). Before any step was measured, one is assumed to take half a beat.

No step runs past the budget. Near capacity the live beat leaves no room, and chunks run there
anyway made every live session late (at 300 dense sessions on the H200 they piled up a 6.5 s
backlog that never drained). Instead a start that finds no room `give_up` beats in a row is
refused (`CpuBackend` does it per slot, with `why`): its caller hears `refused` (capacity) and the
live sessions keep their beat.
Pure bookkeeping (no torch, no clock): the backend reports what it measured.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

UNMEASURED_START_S = 0.08       # a start chunk no one has measured yet: half a beat


@dataclass
class StartBudget:
    margin_s: float = 0.008         # the live cost's spread from beat to beat, the host's jitter
    give_up: int = 31               # beats in a row (~5 s) a start may find no room: well
                                    # inside a client's open timeout (10 s by default)
    smoothing: float = 0.3          # weight of the newest live-cost measurement
    live_s: dict[int, float] = field(default_factory=dict)   # live count → expected seconds
    recent_start_s: deque = field(default_factory=lambda: deque(maxlen=8))
    held_back: int = 0              # beats that held start work back, in total
    given_up: int = 0               # starts refused for want of room

    def observe_live(self, n_live: int, seconds: float) -> None:
        if n_live > 0:
            old = self.live_s.get(n_live)
            self.live_s[n_live] = seconds if old is None else old + self.smoothing * (seconds - old)

    def observe_start(self, seconds: float) -> None:
        self.recent_start_s.append(seconds)

    def expected_start(self) -> float:
        return max(self.recent_start_s, default=UNMEASURED_START_S)

    def expected_live(self, n_live: int) -> float:
        """The measured cost at this live count; else the closest measured count scaled by the
        session ratio (the cost grows at most linearly with sessions); with none measured yet,
        unbounded: the first live beat runs no start work, and measures."""
        if n_live <= 0:
            return 0.0
        if n_live in self.live_s:
            return self.live_s[n_live]
        if not self.live_s:
            return math.inf
        m = min(self.live_s, key=lambda k: (abs(k - n_live), -k))
        return self.live_s[m] * max(1.0, n_live / m)

    def room(self, n_live: int, time_left_s: float) -> float:
        """Seconds this beat can give start work without going past its deadline."""
        return time_left_s - self.margin_s - self.expected_live(n_live)

    def steps(self, n_live: int, time_left_s: float, most: int) -> int:
        """How many start steps (up to `most`) this beat runs; call once per beat that has
        starting sessions. With no live session at least one runs: nobody waits on the beat."""
        fit = int(max(0.0, self.room(n_live, time_left_s)) // self.expected_start())
        n = min(most, max(fit, 1) if n_live == 0 else fit)
        self.held_back += n == 0
        return n

    def why(self, n_live: int, time_left_s: float) -> str:
        """The numbers behind a refused start, for its caller and the log."""
        return (f"no room to start the session for {self.give_up} beats in a row: the "
                f"{n_live} live sessions' beat takes {1e3 * self.expected_live(n_live):.0f} ms of "
                f"the {1e3 * time_left_s:.0f} ms it has, and a start step needs "
                f"{1e3 * self.expected_start():.0f} ms more (+{1e3 * self.margin_s:.0f} ms margin); "
                f"the node serves as many sessions as this device holds on time")
