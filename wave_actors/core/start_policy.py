"""Start policies: when a beat may also run session-start work (prompt prefill, talker warm-up
chunks), as objects the node's configuration passes in and every result records.

Two are built in: `BudgetedStarts` (below) and `EagerStarts` (every start advances every beat,
none is refused: the reference for a CPU machine, and a baseline for scheduling research). A
policy of one's own implements the `StartPolicy` protocol and is named on the command line as
`--policy module:Class key=value ...` (`policy_spec`).

`BudgetedStarts`:
A start step (one bounded chunk of prompt and warm-up for a group of starting sessions) runs
eagerly after the live sessions' frames, in the same beat, so its whole cost lands on every live
session's latency. The budget runs as many steps as fit, with the beat's live frames and a
margin, in the time the beat has left before its deadline (`time_left_s`, from the clock: 160 ms
less how late the beat began and the clock's own routing after the backend returns). A beat that
began behind schedule therefore runs no start work, and start work never adds to a backlog; a
light beat runs several steps, so a burst of opens uses the idle part of the beats.

Costs are what this device measured: the live cost per live count (smoothed), a step's as the
largest of the recent ones (its cost varies with its rows and prompt part, and an underestimate
makes a live beat late; see `expected_start` for measurements grown old). Before any step was
measured, one is assumed to take half a beat.

No step runs past the budget. Near capacity the live beat leaves no room, and chunks run there
anyway would make every live session late, beat after beat, in a backlog that never drains.
Instead a start that finds no room `give_up` beats in a row is
refused (`StartQueue`, with the numbers): its caller hears `refused` (capacity) and the live
sessions keep their beat.
Pure bookkeeping (no torch, no clock): the clock reports what the executor measured.
"""
from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Protocol, runtime_checkable

log = logging.getLogger("wave.start")


@runtime_checkable
class StartPolicy(Protocol):
    """Decides, beat by beat, how much start work runs and when a start gives up. It keeps its
    own measurements (fed by the clock from each beat's timings) and counts what it did."""
    name: str
    give_up: int | None             # beats in a row a start may find no room, or never refused
    held_back: int                  # beats that held start work back, in total
    given_up: int                   # starts refused for want of room

    def observe_live(self, n_live: int, seconds: float) -> None: ...
    def observe_start(self, seconds: float) -> None: ...
    def steps(self, n_live: int, time_left_s: float, most: int) -> int: ...
    def may_go_live(self, n_live: int, time_left_s: float) -> bool: ...
    def why(self, n_live: int, time_left_s: float) -> str: ...
    def describe(self) -> dict: ...


def _describe(policy, step_s: float | None) -> dict:
    """A dataclass policy for results: its name, class, constructor parameters (its `init`
    fields, not its measurements), what it counted and its step's cost as it judges it."""
    return {"name": policy.name, "class": f"{__name__}:{type(policy).__name__}",
            "params": {f.name: getattr(policy, f.name) for f in fields(policy) if f.init and f.repr},
            "held_back": policy.held_back, "given_up": policy.given_up,
            "start_step_ms": None if step_s is None else round(1e3 * step_s, 2)}


@dataclass
class EagerStarts:
    """Every running start advances one step every beat, whatever the live load; a start is
    never refused. Live sessions pay for it in latency near capacity."""
    name: str = field(default="eager", init=False)
    give_up: int | None = field(default=None, init=False)
    held_back: int = field(default=0, init=False)
    given_up: int = field(default=0, init=False)
    recent_start_s: deque = field(default_factory=lambda: deque(maxlen=8), init=False, repr=False)

    def observe_live(self, n_live: int, seconds: float) -> None:
        pass

    def observe_start(self, seconds: float) -> None:
        self.recent_start_s.append(seconds)

    def steps(self, n_live: int, time_left_s: float, most: int) -> int:
        return most

    def may_go_live(self, n_live: int, time_left_s: float) -> bool:
        return True

    def why(self, n_live: int, time_left_s: float) -> str:
        return ""

    def describe(self) -> dict:
        return _describe(self, max(self.recent_start_s, default=None))


@dataclass
class BudgetedStarts:
    """Start steps only where they fit before the beat's deadline (see the module's top)."""
    margin_s: float = 0.008         # the live cost's spread from beat to beat, the host's jitter
    give_up: int = 31               # beats in a row (~5 s) a start may find no room: well
                                    # inside a client's open timeout (10 s by default)
    smoothing: float = 0.3          # weight of the newest live-cost measurement
    unmeasured_start_s: float = 0.08    # a start step no one has measured yet: half a beat
    step_memory_beats: int = 64     # live beats (~10 s) a step's measured cost is judged by
    name: str = field(default="budgeted", init=False)
    live_s: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    recent_start_s: deque = field(default_factory=lambda: deque(maxlen=8), init=False,
                                  repr=False)                                   # (live beat, s)
    live_beats: int = field(default=0, init=False, repr=False)   # age of a step's measurement
    held_back: int = field(default=0, init=False)   # beats that held start work back, in total
    given_up: int = field(default=0, init=False)    # starts refused for want of room

    def __post_init__(self) -> None:
        if self.give_up < 1 or self.margin_s < 0 or not 0 < self.smoothing <= 1:
            raise ValueError("BudgetedStarts: give_up >= 1, margin_s >= 0, 0 < smoothing <= 1")

    def observe_live(self, n_live: int, seconds: float) -> None:
        if n_live > 0:
            self.live_beats += 1
            old = self.live_s.get(n_live)
            self.live_s[n_live] = seconds if old is None else old + self.smoothing * (seconds - old)

    def observe_start(self, seconds: float) -> None:
        self.recent_start_s.append((self.live_beats, seconds))

    def expected_start(self) -> float:
        """The largest step of the last `step_memory_beats` live beats; when every measurement is
        older (no step found room since), the smallest of them, so that one step runs where
        that fits and is measured again: one slow step (a hiccup) must not hold every start
        back until the live load falls."""
        fresh = [s for beat, s in self.recent_start_s
                 if beat >= self.live_beats - self.step_memory_beats]
        if fresh:
            return max(fresh)
        return min((s for _, s in self.recent_start_s), default=self.unmeasured_start_s)

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

    def may_go_live(self, n_live: int, time_left_s: float) -> bool:
        """Whether a beat with `n_live` live sessions still leaves room for a start step."""
        return self.expected_start() <= self.room(n_live, time_left_s)

    def describe(self) -> dict:
        return _describe(self, self.expected_start() if self.recent_start_s else None)

    def why(self, n_live: int, time_left_s: float) -> str:
        """The numbers behind a refused start, for its caller and the log."""
        return (f"no room to start the session for {self.give_up} beats in a row: the "
                f"{n_live} live sessions' beat takes {1e3 * self.expected_live(n_live):.0f} ms of "
                f"the {1e3 * time_left_s:.0f} ms it has, and a start step needs "
                f"{1e3 * self.expected_start():.0f} ms more (+{1e3 * self.margin_s:.0f} ms margin); "
                f"the node serves as many sessions as this device holds on time")


@dataclass
class _Start:
    order: int                      # open order: among equal steps the oldest goes first
    steps: int = 0                  # start steps run
    held: int = 0                   # beats in a row its start found no room
    done: bool = False              # its start work is finished; it goes live when let
    why: str = ""                   # refused: why


class StartQueue:
    """Which starting slots a beat's start steps advance, and when a finished start goes live;
    the one bookkeeping of the engine's backends and the simulator.

    A beat runs as many steps as its policy lets it, each for up to `per_step` slots, each slot
    at most once: the fewest steps first, then the oldest. A start that finds no room
    `policy.give_up` beats in a row is refused (`refused`).

    A finished start goes live at once while the beat, with it live, still has room for a start
    step; otherwise it waits until the starts still running are done (or refused, or closed).
    Near capacity a burst of opens then goes live together: going live one group at a time, the
    first groups' frames filled the beats and left no room for the last groups' starts.
    """

    def __init__(self) -> None:
        self._starts: dict[int, _Start] = {}       # slot → its start, from open to live or close
        self._opens = 0

    def open(self, slot: int) -> None:
        self._opens += 1
        self._starts[slot] = _Start(self._opens)

    def close(self, slot: int) -> None:
        self._starts.pop(slot, None)

    def refused(self, slot: int) -> str | None:
        s = self._starts.get(slot)
        return s.why if s is not None and s.why else None

    def _running(self) -> list[tuple[int, _Start]]:
        return [(slot, s) for slot, s in self._starts.items() if not s.done and not s.why]

    def plan(self, n_live: int, time_left_s: float, budget: StartPolicy,
             per_step: int) -> list[list[int]]:
        """This beat's start steps: the slots of each, in the order they run."""
        running = sorted(self._running(), key=lambda e: (e[1].steps, e[1].order))
        if not running:
            return []
        groups = -(-len(running) // per_step)
        steps = budget.steps(n_live, time_left_s, groups)
        if steps == 0:                                  # no room in this beat: next one
            for slot, s in running:
                s.held += 1
                if budget.give_up is not None and s.held >= budget.give_up:
                    s.why = budget.why(n_live, time_left_s)
                    budget.given_up += 1
                    log.warning("slot %d: session start refused: %s", slot, s.why)
            return []
        chosen = running[:steps * per_step]
        for _, s in chosen:
            s.held, s.steps = 0, s.steps + 1
        slots = [slot for slot, _ in chosen]
        return [slots[k:k + per_step] for k in range(0, len(slots), per_step)]

    def finished(self, slot: int) -> None:
        self._starts[slot].done = True

    def going_live(self, n_live: int, time_left_s: float, budget: StartPolicy) -> list[int]:
        """Finished slots that go live now (oldest first); they leave the queue."""
        done = sorted((s.order, slot) for slot, s in self._starts.items() if s.done)
        running = bool(self._running())
        let = []
        for _, slot in done:
            if running and not budget.may_go_live(n_live + len(let) + 1, time_left_s):
                break                                   # keep the room for the starts running
            let.append(slot)
            del self._starts[slot]
        return let
