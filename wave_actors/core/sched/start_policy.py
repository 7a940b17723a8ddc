"""Start policies: which beats carry start work (slot resets, prompt-snapshot copies, start
rows), and which opens a node admits, as objects the node's configuration passes in and every
result records.

A session's start rides inside the beat, the way chunked prefill shares a decode batch: its
slot's reset (the talker's warm-up copied in with it), then either one copy of its prompt's
snapshot or its system prompt as start rows (one chunk of `prefill_chunk` positions per
starting session a beat, up to `StartShape.start_rows` rows). A GPU executor captures its beat
with those rows once, so their cost is part of a measured beat, not an eager step guessed at
run time.

The default, `GuardedStarts` ("guarded"), sizes each beat's start work to the room the beat
has before its deadline, and refuses an open the node could not carry on time (below). The
others are kept for scheduling research:
  - `EagerStarts` ("eager"): every beat that has starting sessions carries their rows.
  - `BudgetedStarts` ("budgeted"): rows only when the beat with them, as measured at this
    live count, still ends before the deadline less a margin; never held more than `max_hold`
    beats in a row.
  - `HeadroomAdmission` ("headroom") and `ForecastAdmission` ("forecast"), in
    `admission_policies`: rows as eager or budgeted, and opens refused by a fixed reserve or a
    forecast beat.
A policy with an `admit` method is asked before an open takes a free slot; the node refuses
with reason `admission` when it says no.

A policy of one's own implements the `StartPolicy` protocol and is named on the command line as
`--policy module:Class key=value ...` (`policy_spec`).

Pure bookkeeping (no torch, no clock): the clock reports what the executor measured.
"""
from __future__ import annotations

import collections
import statistics

from dataclasses import dataclass, field, fields
from typing import Protocol, runtime_checkable

from wave_actors.core.frames import BEAT_S


@runtime_checkable
class StartPolicy(Protocol):
    """Decides, beat by beat, whether the beat carries its start rows, from what it measured."""
    name: str
    held_back: int                  # beats whose start rows were held back, in total

    def observe(self, n_live: int, with_rows: bool, seconds: float) -> None: ...
    def carry_rows(self, n_live: int, time_left_s: float) -> bool: ...
    def describe(self) -> dict: ...


def describe_policy(policy) -> dict:
    """A dataclass policy for results: its name, class, constructor parameters (its `init`
    fields, not its measurements) and what it counted."""
    return {"name": policy.name, "class": f"{type(policy).__module__}:{type(policy).__name__}",
            "params": {f.name: getattr(policy, f.name) for f in fields(policy) if f.init and f.repr},
            "held_back": policy.held_back}


@dataclass
class EagerStarts:
    """Start rows in every beat that has starting sessions."""
    name: str = field(default="eager", init=False)
    held_back: int = field(default=0, init=False)

    def observe(self, n_live: int, with_rows: bool, seconds: float) -> None:
        pass

    def carry_rows(self, n_live: int, time_left_s: float) -> bool:
        return True

    def describe(self) -> dict:
        return describe_policy(self)


@dataclass
class BudgetedStarts:
    """Start rows only in beats they fit (see the module's top)."""
    margin_s: float = 0.008         # the beat's spread from beat to beat, the host's jitter
    max_hold: int = 6               # beats in a row a start's rows may wait (~1 s)
    smoothing: float = 0.3          # weight of the newest measurement
    name: str = field(default="budgeted", init=False)
    held_back: int = field(default=0, init=False)
    beat_s: dict[tuple[int, bool], float] = field(default_factory=dict, init=False, repr=False)
    _held: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_hold < 0 or self.margin_s < 0 or not 0 < self.smoothing <= 1:
            raise ValueError("BudgetedStarts: max_hold >= 0, margin_s >= 0, 0 < smoothing <= 1")

    def observe(self, n_live: int, with_rows: bool, seconds: float) -> None:
        old = self.beat_s.get((n_live, with_rows))
        self.beat_s[n_live, with_rows] = (seconds if old is None
                                          else old + self.smoothing * (seconds - old))

    def expected(self, n_live: int) -> float | None:
        """A beat with start rows at this live count: measured; else a beat without them at the
        closest measured count (scaled up by the session ratio, never down) plus what rows
        added where both were measured; None when that is not known (such a beat is carried,
        and measured)."""
        seen = {n: s for (n, rows), s in self.beat_s.items() if rows}
        if n_live in seen:
            return seen[n_live]
        plain = {n: s for (n, rows), s in self.beat_s.items() if not rows}
        both = [n for n in seen if n in plain]
        if not plain or not both:
            return None
        added = max(0.0, max(seen[n] - plain[n] for n in both))
        m = min(plain, key=lambda k: (abs(k - n_live), -k))
        return plain[m] * max(1.0, n_live / max(1, m)) + added

    def carry_rows(self, n_live: int, time_left_s: float) -> bool:
        expected = self.expected(n_live)
        if (expected is None or self._held >= self.max_hold
                or expected + self.margin_s <= time_left_s):
            self._held = 0
            return True
        self._held += 1
        self.held_back += 1
        return False

    def describe(self) -> dict:
        return describe_policy(self) | {"beat_with_rows_ms": {
            n: round(1e3 * s, 2) for (n, rows), s in sorted(self.beat_s.items()) if rows}}


def admission(policy, n_live: int, n_starting: int, slots: int) -> str | None:
    """Why the policy refuses one more open with this many sessions live and starting (None:
    admitted). Slots being full is the table's to refuse, not the policy's; a policy without
    an `admit` method admits every open that finds a slot."""
    admit = getattr(policy, "admit", None)
    return None if admit is None else admit(n_live, n_starting, slots)


OVERLOADED_START_S = 0.1 * BEAT_S   # start work a beat carries where beats are late anyway
HOST_BEATS = 64         # beats whose host share admission weighs (their median)
STARTS_TO_LEARN = 8      # a beat's resets and copies that say what they cost over its jitter


@dataclass
class GuardedStarts:
    """Start work only where it fits: a beat's start rows and snapshot copies are sized so the
    beat, as forecast, still ends `margin_s` before the deadline (see the module's top).

    The forecast is the beat without start work at this live count (learned from the beats
    run: each one's time less what its start work and rolls are priced at, an average that
    rises at once and falls slowly, so a beat that ran long at this count is believed) plus
    the start work: per snapshot copy `copy_s`, per slot reset `reset_s`, per roll `roll_s`,
    per row capture what it added where measured (`row_s`, from the executor's build, else
    learned). Rows never ride in a beat the forecast says they would make late, however long
    they wait; a count never measured is measured first with rows held back, so what rows
    cost is never learned from a late beat. A node whose beat is forecast past the deadline
    with no start work at all has no on-time call to protect: its beats carry
    OVERLOADED_START_S of start work each, so every admitted open still starts."""
    margin_s: float = 0.008         # the beat's spread from beat to beat, the host's jitter
    # a snapshot copy's and a slot reset's device time until learned (a fill of many counts
    # never measured learns nothing): a reset writes the slot's state less its KV rows (~4 MB
    # and the talker's warm-up rows) in ~40 writes (one captured replay for a few scattered
    # slots), a copy moves the prompt's thinker state (~150 MB each way) in 5 launches (one
    # captured replay for a few scattered copies); a run of consecutive slots shares both, so
    # these are a lone start's, above what a run costs a slot
    copy_s: float = 0.00015
    reset_s: float = 0.0004
    roll_s: float = 0.0008
    row_prior_s: float = 0.0025     # a start row's cost until its capture's is known
    fall: float = 0.1               # weight of a faster beat in the average (slower: at once)
    name: str = field(default="guarded", init=False)
    held_back: int = field(default=0, init=False)
    copies_held: int = field(default=0, init=False)
    resets_held: int = field(default=0, init=False)
    refused: int = field(default=0, init=False)
    observed: int = field(default=0, init=False)        # beats measured
    overloaded: int = field(default=0, init=False)      # beats late without start work
    overhead_s: float = field(default=0.0, init=False, repr=False)   # the beat's host share
    # the host shares of the last HOST_BEATS beats: each is already the worst of the clock's
    # last 16, so one slow moment fills 16 of them; the median of 64 passes it by
    _host: collections.deque = field(default_factory=lambda: collections.deque(maxlen=HOST_BEATS),
                                     init=False, repr=False)
    row_s: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    row_build_s: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    plain_s: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    # beats that carried no start work nor roll, by live count: what the start costs are
    # learned against (never from the learned costs themselves)
    clean_s: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    prior_s: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    copy_est: float = field(default=0.0, init=False, repr=False)     # learned from beats
    reset_est: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        if min(self.margin_s, self.copy_s, self.reset_s, self.roll_s, self.row_prior_s) < 0 \
                or not 0 < self.fall <= 1:
            raise ValueError("GuardedStarts: costs and margin >= 0, 0 < fall <= 1")
        self.copy_est, self.reset_est = self.copy_s, self.reset_s

    def know_rows(self, added_s: dict[int, float]) -> None:
        """What each row capture adds to a beat, as the executor measured it at build."""
        built = {int(k): max(0.0, float(v)) for k, v in added_s.items()}
        self.row_s.update(built)
        self.row_build_s.update(built)          # never a cost learned since: what costs fall to

    def know_beats(self, beat_s: dict[int, float]) -> None:
        """Beats the executor measured at build (live count → seconds, every cache full): the
        forecast's line where no beat at a count near it was run yet."""
        self.prior_s.update({int(k): float(v) for k, v in beat_s.items()})

    def _row_cost(self, capture: int) -> float:
        return self.row_s.get(capture, capture * self.row_prior_s) if capture else 0.0

    def _work_s(self, rows: int, copies: int, resets: int, rolls: int) -> float:
        return (self._row_cost(rows) + copies * self.copy_est + resets * self.reset_est
                + rolls * self.roll_s)

    def _average(self, table: dict, key: int, value: float) -> None:
        """Rises at once, falls by `fall`: a beat that ran long is believed."""
        old = table.get(key)
        table[key] = value if old is None or value > old else old + self.fall * (value - old)

    def observe(self, n_live: int, with_rows: bool, seconds: float) -> None:
        self.observe_beat(n_live, 0, 0, 0, 0, seconds)

    def observe_beat(self, n_live: int, rows: int, copies: int, resets: int, rolls: int,
                     seconds: float) -> None:
        """rows: the row capture the beat replayed (0: none)."""
        self.observed += 1
        if rows and n_live in self.plain_s:
            self._average(self.row_s, rows, max(0.0, seconds - self.plain_s[n_live]
                                                - self._work_s(0, copies, resets, rolls)))
        # what the beat would have taken without its starts: a beat at this very count that
        # carried none, once any beat did (a line between counts would cross the steps where a
        # batch pads to its next graph); before that (a fill) the beats less their priced work
        base = self.clean_s.get(n_live) if self.clean_s else self.plain_s.get(n_live)
        if copies + resets >= STARTS_TO_LEARN and base is not None:
            # resets and copies ride together (a slot's reset, then its copy): one scale for
            # both, rising at once, falling slowly. Not against `plain_s` once beats without
            # starts ran: it is itself beats less their priced starts, so a slow beat priced
            # too high lowers it and makes the next beat's starts look dearer still (a loop
            # that took the learned costs to 8× under steady traffic)
            priced = copies * self.copy_est + resets * self.reset_est
            rest = seconds - base - self._work_s(rows, 0, 0, rolls)
            scale = min(8.0, max(0.25, rest / priced))
            scale = scale if scale > 1 else 1 + self.fall * (scale - 1)
            self.copy_est *= scale
            self.reset_est *= scale
        if not (rows or copies or resets or rolls):
            self._average(self.clean_s, n_live, seconds)
        self._average(self.plain_s, n_live, seconds - self._work_s(rows, copies, resets, rolls))

    def forecast(self, n_live: int) -> float | None:
        """The beat without start work at this live count: measured; else on the line through
        the measured counts either side of it (past the last one, along the line through the
        last two, never falling); else, one count measured, scaled up by the live ratio (never
        down); None before any beat."""
        return self._on_line({**self.prior_s, **self.plain_s}, n_live)

    @staticmethod
    def _on_line(t: dict[int, float], n_live: int) -> float | None:
        """`forecast`'s reading of a table of beat times by live count."""
        if n_live in t:
            return t[n_live]
        if not t:
            return None
        below = [k for k in t if k < n_live]
        above = [k for k in t if k > n_live]
        if below and above:
            a, b = max(below), min(above)
        elif len(below) >= 2:
            a, b = sorted(below)[-2:]
        else:
            m = min(t, key=lambda k: (abs(k - n_live), -k))
            return t[m] * max(1.0, n_live / max(1, m))
        slope = max(0.0, (t[b] - t[a]) / (b - a))
        return max(t[a], t[a] + slope * (n_live - a))

    def start_room(self, n_live: int, time_left_s: float) -> float | None:
        """Seconds of start work (resets, snapshot copies, start rows; the book prices them
        with `reset_est`, `copy_est`, `rows_in`) the beat has room for before its deadline less
        the margin; None: nothing measured yet (the work rides, and is measured)."""
        if time_left_s > 0:       # 0: the last beat overran, which says nothing of the host
            # the median of recent beats: the clock's time_left_s already leaves the worst
            # host share of its recent beats to this beat; admission weighs the whole call,
            # which one slow host moment does not change. A fill's first beats (hundreds of
            # resets, the clock catching up) say nothing of the steady share: until half the
            # window is in, admission trusts the slots the node was sized to.
            self._host.append(BEAT_S - time_left_s)
            self.overhead_s = (statistics.median(self._host)
                               if len(self._host) >= HOST_BEATS // 2 else 0.0)
        if n_live == 0:
            # no live call to make late: a beat's worth of starts, even behind an overrun (a
            # clock still behind would otherwise never start anyone)
            return BEAT_S - self.margin_s
        plain = self.forecast(n_live)
        if plain is not None and plain > BEAT_S:
            # past the deadline with no start work at all: there is no on-time call to protect,
            # and holding starts would leave every admitted open waiting for ever
            self.overloaded += 1
            return OVERLOADED_START_S
        return None if plain is None else time_left_s - self.margin_s - plain

    def rows_in(self, room: float, row_captures: tuple[int, ...]) -> int:
        """The largest row capture whose cost fits in `room` (0: none)."""
        return max([c for c in row_captures if c and self._row_cost(c) <= room] + [0])

    def held(self, rows: bool, resets: int, copies: int) -> None:
        """What a beat left for a later one: its start rows, resets, copies. While rows wait,
        what they were learned to cost falls back towards the build's measurement (or the
        prior) by `fall` a beat: a cost learned from one slow beat is only re-measured when
        rows ride, so believed for ever it would hold every start that needs rows for ever."""
        if rows:
            for c, cost in self.row_s.items():
                base = self.row_build_s.get(c, c * self.row_prior_s)
                if cost > base:
                    self.row_s[c] = cost + self.fall * (base - cost)
        self.held_back += rows
        self.resets_held += resets
        self.copies_held += copies

    def carry_rows(self, n_live: int, time_left_s: float) -> bool:
        room = self.start_room(n_live, time_left_s)
        return room is None or self.rows_in(room, tuple(self.row_s) or (1,)) > 0

    def admit(self, n_live: int, n_starting: int, slots: int) -> str | None:
        """An open is admitted unless the beat with it and every session live or starting is
        forecast past the deadline (less the margin and the host's share): a call the node
        cannot carry on time is refused now, not left to make everyone's beats late."""
        # a session leaving is live in the book until its close applies at the next beat, but
        # its slot is free already: the node never holds more than `slots`
        n = min(n_live + n_starting + 1, slots)
        known = {**self.prior_s, **self.plain_s}
        if n not in known and len(known) < 2:
            return None         # one count measured says nothing of the next: admit, measure
        expected = self.forecast(n)
        if expected is None or n == 1 or expected + self.margin_s + self.overhead_s <= BEAT_S:
            return None
        self.refused += 1
        return (f"a beat of {n} sessions is forecast at {1e3 * expected:.1f} ms, past the "
                f"{1e3 * BEAT_S:.0f} ms beat less {1e3 * (self.margin_s + self.overhead_s):.0f} "
                "ms of margin and host time")

    def describe(self) -> dict:
        return describe_policy(self) | {"copies_held": self.copies_held, "refused": self.refused,
                                  "beats_observed": self.observed,
                                  "beats_overloaded": self.overloaded,
                                  "resets_held": self.resets_held,
                                  "copy_ms": round(1e3 * self.copy_est, 3),
                                  "reset_ms": round(1e3 * self.reset_est, 3),
                                  "row_ms": {k: round(1e3 * v, 2) for k, v in self.row_s.items()}}
