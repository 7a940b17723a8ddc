"""The slot book with Python per slot: the reference `tests/runtime/test_slot_book_arrays.py`
holds the array book (`wave_actors.core.sched.slot_book.SlotBook`, what the clock runs) to."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wave_actors.core.frames import FRAMES_PER_BEAT
from wave_actors.core.sched.slot_book import BookPlan, carry_start_rows
from wave_actors.core.sched.start_shape import StartShape
from wave_actors.core.sched.start_policy import StartPolicy
from wave_actors.core.sched.start_queue import StartQueue


@dataclass
class SlotState:
    """One slot's bookkeeping; phase: closed → starting → live."""
    phase: str = "closed"
    session: int = 0                    # incarnation number: the noise key of this session
    prompt: list[int] = field(default_factory=list)
    prompt_done: int = 0                # thinker positions prefilled
    frames: int = 0                     # frames run since it went live
    rolled: int = 0                     # frames that left its caches by rolls
    forced: deque = field(default_factory=deque)    # function-result tokens still to force
    reset: bool = False                 # state rows to reset before anything else runs
    spec: Any = None                    # the SessionSpec it opened with (handed over at reset)

    @property
    def context(self) -> int:           # frames its caches hold past the prompt and warm-up
        return self.frames - self.rolled


class PlainSlotBook:
    """The slot book as it was written first: Python per slot (the reference)."""

    def __init__(self, slots: int, shape: StartShape, policy: StartPolicy,
                 frames_per_session: int, roll_frames: int):
        """`frames_per_session` and `roll_frames` come from ExecutorOptions, which checks them."""
        self.shape, self.policy = shape, policy
        self.frames_per_session, self.roll_frames = frames_per_session, roll_frames
        self.slots = [SlotState() for _ in range(slots)]
        self.clean = [False] * slots        # reset since its last session closed, untouched
        self.cleaning: list[int] = []       # closed, not cleaned yet: in close order
        self.fresh: list[int] = []          # opened clean since the last plan
        self.starts = StartQueue()
        self._sessions = 0
        self._beat = 0

    # -- session lifecycle --------------------------------------------------------------------------
    def open(self, slot: int, tokens: list[int], spec: Any = None) -> int:
        """The slot starts a new session with this prompt; returns its session number."""
        self._sessions += 1
        clean, self.clean[slot] = self.clean[slot], False
        if slot in self.cleaning:
            self.cleaning.remove(slot)
        if clean:
            self.fresh.append(slot)
        self.slots[slot] = SlotState("starting", self._sessions, list(tokens), reset=not clean,
                                     spec=spec)
        self.starts.open(slot)
        return self._sessions

    def close(self, slot: int) -> None:
        self.slots[slot] = SlotState()
        self.clean[slot] = False
        if slot in self.fresh:
            self.fresh.remove(slot)
        if self.shape.cleans and slot not in self.cleaning:
            self.cleaning.append(slot)
        self.starts.close(slot)

    def force(self, slot: int, ids: list[int]) -> None:
        """Tool-result tokens to force into the slot's function channel, one per frame."""
        if self.slots[slot].phase != "closed":
            self.slots[slot].forced.extend(ids)

    def phase(self, slot: int) -> str:
        return self.slots[slot].phase

    def ready(self, slot: int) -> bool:
        return self.slots[slot].phase == "live"

    # -- one beat -----------------------------------------------------------------------------------
    def plan(self, time_left_s: float) -> BookPlan:
        resets = [i for i, s in enumerate(self.slots) if s.reset]
        for i in resets:
            self.slots[i].reset = False
        cleans, self.cleaning = self.cleaning[:self.shape.cleans], self.cleaning[self.shape.cleans:]
        for i in cleans:
            self.clean[i] = True
        live = [i for i, s in enumerate(self.slots) if s.phase == "live"]
        roll = [(i, len(self.slots[i].prompt)) for i in self._rolling(live)]
        rows = [self.slots[i] for i in live]
        forced = np.full((len(live), FRAMES_PER_BEAT), -1, np.int64)
        for r, s in enumerate(rows):
            for f in range(min(FRAMES_PER_BEAT, len(s.forced))):
                forced[r, f] = s.forced.popleft()
        plan = BookPlan(
            self._beat, resets, live, forced,
            np.array([s.session for s in rows], np.int64),
            np.array([s.frames for s in rows], np.int64),
            max((len(s.prompt) + s.context for s in rows), default=0) + FRAMES_PER_BEAT,
            max((s.context for s in rows), default=0) + self.shape.warmup_positions
            + FRAMES_PER_BEAT,
            np.array([s.context for s in rows], np.int64), roll,
            self.roll_frames if roll else 0,
            opened={i: self.slots[i].spec for i in resets + self.fresh}, cleans=cleans)
        self.fresh = []
        self._beat += 1
        for s in rows:
            s.frames += FRAMES_PER_BEAT
        for i, _ in roll:
            self.slots[i].rolled += self.roll_frames
        if self.starts.running and self.policy.carry_rows(len(live), time_left_s):
            # The start rows were never rewritten as arrays: both books share them.
            carry_start_rows(self.slots, self.starts, self.shape, plan)
        for i in self.starts.going_live():
            self.slots[i].phase = "live"          # in the beats from the next one on
        return plan

    def _rolling(self, live: list[int]) -> list[int]:
        """The live slots that roll after this beat's frames (the executor queues the roll
        behind the beat's device work), for the next beat's: every slot whose next beat would
        pass `frames_per_session`, and, spread over the beats before, a few that are within
        `roll_frames` of it (the fullest first), as many a beat as the live slots need on
        average. Sessions that started together would otherwise all roll in the same beat, and
        one beat would move every session's cache rows."""
        fps, drop = self.frames_per_session, self.roll_frames
        ahead = [(self.slots[i].context, i) for i in live]
        must = [i for c, i in ahead if c + 2 * FRAMES_PER_BEAT > fps]
        early = sorted(((c, i) for c, i in ahead
                        if fps - drop < c + 2 * FRAMES_PER_BEAT <= fps and c >= drop),
                       reverse=True)
        spread = -(-FRAMES_PER_BEAT * len(live) // drop) if drop else 0
        return sorted(must + [i for _, i in early[:max(0, spread - len(must))]])

    def observe(self, plan: BookPlan, seconds: float | None) -> None:
        """What the executor measured for the plan: the whole beat, start rows included."""
        if seconds is not None and (plan.live or plan.rows):
            self.policy.observe(len(plan.live), bool(plan.rows), seconds)
