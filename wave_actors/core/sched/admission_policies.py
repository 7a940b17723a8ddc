"""Start policies that also decide admission, kept for scheduling research (the default,
`GuardedStarts`, is in `start_policy`):
  - `HeadroomAdmission` ("headroom"): rows as eager; an open is admitted only while the latest
    measured beat left at least `headroom_s` of the beat spare (a fixed reserve).
  - `ForecastAdmission` ("forecast"): rows as budgeted; an open is admitted only when a line
    fitted to the measured beats forecasts that the beat with every live and starting session
    and this one still ends `margin_s` before the deadline.
Each holds the rows policy it starts by (composed, not inherited).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from wave_actors.core.frames import BEAT_S
from wave_actors.core.sched.start_policy import BudgetedStarts, EagerStarts, describe_policy


@dataclass
class HeadroomAdmission:
    """Eager start rows, and opens only while the latest beat left `headroom_s` spare."""
    headroom_s: float = 0.02
    name: str = field(default="headroom", init=False)
    refused: int = field(default=0, init=False)
    last_s: float | None = field(default=None, init=False, repr=False)
    starts: EagerStarts = field(default_factory=EagerStarts, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.headroom_s < BEAT_S:
            raise ValueError(f"HeadroomAdmission: 0 <= headroom_s < {BEAT_S}")

    @property
    def held_back(self) -> int:
        return self.starts.held_back

    def observe(self, n_live: int, with_rows: bool, seconds: float) -> None:
        self.starts.observe(n_live, with_rows, seconds)
        if not with_rows:             # a start's extra cost passes; the live load stays
            self.last_s = seconds

    def carry_rows(self, n_live: int, time_left_s: float) -> bool:
        return self.starts.carry_rows(n_live, time_left_s)

    def admit(self, n_live: int, n_starting: int, slots: int) -> str | None:
        # An idle node runs no beat to measure: the last one's time is of a load that left,
        # and holding it would refuse every open from then on.
        if (self.last_s is None or self.last_s + self.headroom_s <= BEAT_S
                or n_live + n_starting == 0):
            return None
        self.refused += 1
        return (f"the last beat took {1e3 * self.last_s:.1f} ms, within the "
                f"{1e3 * self.headroom_s:.0f} ms headroom of the {1e3 * BEAT_S:.0f} ms beat")

    def describe(self) -> dict:
        return describe_policy(self) | {"refused": self.refused}


@dataclass
class ForecastAdmission:
    """Budgeted start rows, and opens only when the forecast beat still meets the deadline."""
    margin_s: float = 0.008         # the budget's margin, and the forecast's
    max_hold: int = 6
    smoothing: float = 0.3
    name: str = field(default="forecast", init=False)
    refused: int = field(default=0, init=False)
    starts: BudgetedStarts = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.starts = BudgetedStarts(self.margin_s, self.max_hold, self.smoothing)

    @property
    def held_back(self) -> int:
        return self.starts.held_back

    @property
    def beat_s(self) -> dict[tuple[int, bool], float]:
        return self.starts.beat_s

    def observe(self, n_live: int, with_rows: bool, seconds: float) -> None:
        self.starts.observe(n_live, with_rows, seconds)

    def carry_rows(self, n_live: int, time_left_s: float) -> bool:
        return self.starts.carry_rows(n_live, time_left_s)

    def forecast(self, n: int) -> float | None:
        """A beat of n live sessions: the measured beats without start rows fitted by a line
        in the live count, never falling with it; one count seen: its time (a slope needs two,
        and an engine that pads its batch to a captured size takes the same time at every
        count); None before any beat was measured. Start rows are the budget's to place:
        admission weighs the load a session adds for its whole call, not its start's beat."""
        plain = {k: s for (k, rows), s in self.beat_s.items() if not rows and k > 0}
        if not plain:
            return None
        ks = sorted(plain)
        if len(ks) == 1:
            return plain[ks[0]]
        mk = sum(ks) / len(ks)
        ms = sum(plain[k] for k in ks) / len(ks)
        slope = sum((k - mk) * (plain[k] - ms) for k in ks) / sum((k - mk) ** 2 for k in ks)
        return ms + max(0.0, slope) * (n - mk)

    def admit(self, n_live: int, n_starting: int, slots: int) -> str | None:
        expected = self.forecast(n_live + n_starting + 1)
        if expected is None or expected + self.margin_s <= BEAT_S:
            return None
        self.refused += 1
        return (f"a beat of {n_live + n_starting + 1} sessions is forecast at "
                f"{1e3 * expected:.1f} ms, past the {1e3 * BEAT_S:.0f} ms beat less a "
                f"{1e3 * self.margin_s:.0f} ms margin")

    def describe(self) -> dict:
        return self.starts.describe() | describe_policy(self) | {"refused": self.refused}
