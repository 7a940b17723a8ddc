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
makes a live beat late; see `expected_start` for measurements grown old). Before any step was
measured, one is assumed to take half a beat.

No step runs past the budget. Near capacity the live beat leaves no room, and chunks run there
anyway made every live session late (at 300 dense sessions on the H200 they piled up a 6.5 s
backlog that never drained). Instead a start that finds no room `give_up` beats in a row is
refused (`StartQueue`, with the numbers): its caller hears `refused` (capacity) and the live
sessions keep their beat.
Pure bookkeeping (no torch, no clock): the backend reports what it measured.
"""
from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field

UNMEASURED_START_S = 0.08       # a start chunk no one has measured yet: half a beat
STEP_MEMORY_BEATS = 64          # live beats (~10 s) a start step's measured cost is judged by

log = logging.getLogger("wave.start")


@dataclass
class StartBudget:
    margin_s: float = 0.008         # the live cost's spread from beat to beat, the host's jitter
    give_up: int = 31               # beats in a row (~5 s) a start may find no room: well
                                    # inside a client's open timeout (10 s by default)
    smoothing: float = 0.3          # weight of the newest live-cost measurement
    live_s: dict[int, float] = field(default_factory=dict)   # live count → expected seconds
    recent_start_s: deque = field(default_factory=lambda: deque(maxlen=8))  # (live beat, s)
    live_beats: int = 0             # live beats observed: the age of a step's measurement
    held_back: int = 0              # beats that held start work back, in total
    given_up: int = 0               # starts refused for want of room

    def observe_live(self, n_live: int, seconds: float) -> None:
        if n_live > 0:
            self.live_beats += 1
            old = self.live_s.get(n_live)
            self.live_s[n_live] = seconds if old is None else old + self.smoothing * (seconds - old)

    def observe_start(self, seconds: float) -> None:
        self.recent_start_s.append((self.live_beats, seconds))

    def expected_start(self) -> float:
        """The largest step of the last STEP_MEMORY_BEATS live beats; when every measurement is
        older (no step found room since), the smallest of them, so that one step runs where
        that fits and is measured again: one slow step (a hiccup) must not hold every start
        back until the live load falls."""
        fresh = [s for beat, s in self.recent_start_s
                 if beat >= self.live_beats - STEP_MEMORY_BEATS]
        if fresh:
            return max(fresh)
        return min((s for _, s in self.recent_start_s), default=UNMEASURED_START_S)

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

    A beat runs as many steps as its budget has room for (all at once without a budget), each
    for up to `per_step` slots, each slot at most once: the fewest steps first, then the oldest.
    A start that finds no room `budget.give_up` beats in a row is refused (`refused`).

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

    def plan(self, n_live: int, time_left_s: float, budget: StartBudget | None,
             per_step: int) -> list[list[int]]:
        """This beat's start steps: the slots of each, in the order they run."""
        running = sorted(self._running(), key=lambda e: (e[1].steps, e[1].order))
        if not running:
            return []
        groups = -(-len(running) // per_step)
        steps = groups if budget is None else budget.steps(n_live, time_left_s, groups)
        if steps == 0:                                  # no room in this beat: next one
            for slot, s in running:
                s.held += 1
                if s.held >= budget.give_up:
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

    def going_live(self, n_live: int, time_left_s: float,
                   budget: StartBudget | None) -> list[int]:
        """Finished slots that go live now (oldest first); they leave the queue."""
        done = sorted((s.order, slot) for slot, s in self._starts.items() if s.done)
        running = bool(self._running())
        let = []
        for _, slot in done:
            if (budget is not None and running and budget.expected_start()
                    > budget.room(n_live + len(let) + 1, time_left_s)):
                break                                   # keep the room for the starts running
            let.append(slot)
            del self._starts[slot]
        return let
