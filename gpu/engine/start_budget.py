"""When a beat may also run session-start work (prompt prefill, talker warm-up chunks).

A start chunk runs eagerly after the live sessions' frames, in the same beat, so it adds its
whole cost to every live session's latency. The budget runs it only in beats whose live frames
leave room for it: `allow` compares the expected live cost of this beat (measured per live
count) plus the expected cost of a start chunk with the budget. Both are running estimates of
what was measured on this device; an unmeasured cost counts as zero (measure it once).

Progress: a starting session must not wait forever when the node is already at its limit. After
`max_wait` beats in a row without start work, one chunk runs anyway; that beat may be late and
the operator sees it, which is the honest signal that the node holds more sessions than it
serves on time.
Pure bookkeeping (no torch, no clock): the backend reports what it measured.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StartBudget:
    budget_s: float                 # live frames + start work must fit in this
    max_wait: int = 50              # beats a start may be held back (50 beats = 8 s)
    smoothing: float = 0.3          # weight of the newest measurement
    live_s: dict[int, float] = field(default_factory=dict)   # live count → expected seconds
    start_s: float = 0.0            # expected seconds of one beat's start work
    waited: int = 0                 # beats in a row that held start work back
    held_back: int = 0              # beats that held start work back, in total
    forced: int = 0                 # chunks run past the budget to guarantee progress

    def _blend(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)

    def observe_live(self, n_live: int, seconds: float) -> None:
        if n_live > 0:
            self.live_s[n_live] = self._blend(self.live_s.get(n_live), seconds)

    def observe_start(self, seconds: float) -> None:
        self.start_s = self._blend(self.start_s or None, seconds)

    def expected_live(self, n_live: int) -> float:
        """The measured cost at this live count; else the closest measured count scaled by the
        session ratio (the cost grows at most linearly with sessions)."""
        if n_live <= 0:
            return 0.0
        if n_live in self.live_s:
            return self.live_s[n_live]
        if not self.live_s:
            return 0.0
        m = min(self.live_s, key=lambda k: (abs(k - n_live), -k))
        return self.live_s[m] * max(1.0, n_live / m)

    def allow(self, n_live: int) -> bool:
        """Whether this beat runs start work; call once per beat that has starting sessions."""
        if n_live == 0 or self.expected_live(n_live) + self.start_s <= self.budget_s:
            self.waited = 0
            return True
        if self.waited >= self.max_wait:
            self.waited = 0
            self.forced += 1
            return True
        self.waited += 1
        self.held_back += 1
        return False
