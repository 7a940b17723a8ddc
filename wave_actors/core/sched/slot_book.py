"""The slot book: the model-side bookkeeping of every slot, the same for every executor.

Per slot: its phase (closed → starting → live), its session number (the noise key), its
prompt and how much of it is prefilled, the frames it has run and any tool-result tokens still
to force. Once a beat, `plan` turns that into a `BookPlan`: which slots reset (the talker's
warm-up is copied in with the reset; a slot cleaned behind an earlier beat, after its last
session closed, needs none), which run their two frames (with forced tokens and noise
keys), which start rows the beat carries (one chunk of prompt each for up to `start_rows`
starting slots, cut by the executor's `StartShape`; the start policy says whether this beat
carries them, `StartQueue` which slots take them), and which finished starts go live for the
next beat. The book advances its counters as if the plan ran: an executor never decides any of
this, so the simulator's start model is the engine's by construction.

Context: a call may last any time. A session whose caches would pass `frames_per_session`
frames in its next beat rolls after this one (or a little before, to spread rolls over beats):
its oldest `roll_frames` frames leave its attention caches, its system prompt and talker
warm-up stay as sinks, and it runs on (StreamingLLM's window with sinks; the Mamba state
carries on). The plan names the slots that
roll and where their sinks end; the executor moves their cache rows.

Torch-free and clock-free: the clock owns one book per incarnation and feeds it measurements.
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wave_actors.core.frames import FRAMES_PER_BEAT
from wave_actors.core.sched.snapshots import SnapshotIndex
from wave_actors.core.sched.start_policy import StartPolicy
from wave_actors.core.sched.start_queue import StartQueue
from wave_actors.core.sched.start_shape import StartShape


@dataclass
class SlotState:
    """One slot's bookkeeping that only its start or its forced tokens read; phase: closed →
    starting → live. (Its frame counters are the book's arrays.)"""
    phase: str = "closed"
    prompt: list[int] = field(default_factory=list)
    prompt_done: int = 0                # thinker positions prefilled
    forced: deque = field(default_factory=deque)    # function-result tokens still to force
    spec: Any = None                    # the SessionSpec it opened with (handed over at reset)
    save_at: int = 0                    # a shared prefix's end: its state is kept as a snapshot


@dataclass
class BookPlan:
    """One beat's work, in plain host values; an executor runs exactly this."""
    beat: int
    resets: list[int]                   # slots whose state rows reset before anything runs
    live: list[int]                     # slots that run both frames (rows of the batch)
    forced: np.ndarray                  # int64 [B, 2]: function tokens to force, −1 = none
    session: np.ndarray                 # int64 [B]: noise keys
    frame0: np.ndarray                  # int64 [B]: index of this beat's first frame
    thinker_need: int                   # positions the live frames reach (thinker, talker)
    talker_need: int
    context: np.ndarray                 # int64 [B]: frames its caches hold past the prompt
    roll: list[tuple[int, int]] = field(default_factory=list)  # (slot, its thinker sinks): roll
                                        # after this beat's frames
    roll_frames: int = 0                # frames each rolling slot drops (after its sinks)
    rows: list[tuple[int, list[int], int]] = field(default_factory=list)  # start rows: (slot,
                                        # its next prompt chunk, the chunk's first position)
    started: list[int] = field(default_factory=list)  # prompts finished by this beat's rows
                                        # or copies
    opened: dict[int, Any] = field(default_factory=dict)  # resets: slot → its SessionSpec
    copies: list[tuple[int, int, int]] = field(default_factory=list)  # (slot, snapshot entry,
                                        # positions): copied into the slot after the resets,
                                        # before the frames (a start from a prompt snapshot)
    saves: list[tuple[int, int, int]] = field(default_factory=list)  # (slot, snapshot entry,
                                        # positions): the slot's start state kept in the entry
                                        # after this beat's start rows
    cleans: list[int] = field(default_factory=list)  # slots whose sessions closed: reset
                                        # behind this beat's work, their next open needs none

    def idle(self) -> bool:
        """Nothing for an executor to run."""
        return not (self.live or self.rows or self.resets or self.copies or self.cleans)


def carry_start_rows(slots: list, starts: StartQueue, shape: StartShape, plan: BookPlan,
                     rows: int | None = None) -> None:
    """The beat's start rows into `plan`: the next prompt chunk of each starting slot the queue
    picks, at most `rows` (default: the shape's), (`slots`: each slot's `prompt` and
    `prompt_done`); a prompt finished is `started`."""
    for i in starts.plan(shape.start_rows if rows is None else rows):
        s = slots[i]
        chunk = s.prompt[s.prompt_done:s.prompt_done + shape.prefill_chunk]
        plan.rows.append((i, chunk, s.prompt_done))
        s.prompt_done += len(chunk)
        if s.prompt_done >= len(s.prompt):
            starts.finished(i)
            plan.started.append(i)


class SlotBook:
    """The slots' bookkeeping. What every beat reads of every slot (live or not, frames run,
    frames rolled, prompt length, reset due) is kept in arrays, so a plan costs a few array
    operations rather than Python per slot; the rest (prompt, forced tokens, spec) stays in
    each slot's `SlotState`, read only for the few slots starting or forcing."""

    def __init__(self, slots: int, shape: StartShape, policy: StartPolicy,
                 frames_per_session: int, roll_frames: int,
                 snapshots: SnapshotIndex | None = None):
        """`frames_per_session` and `roll_frames` come from ExecutorOptions, which checks them;
        `snapshots`: the executor's prompt snapshots (None: every start prefills)."""
        self.shape, self.policy = shape, policy
        self.snapshots = snapshots if snapshots is not None and snapshots.enabled else None
        # opened slots not started yet (their reset first): slot → prompt key (None: no index)
        self._placing: dict[int, str | None] = {}
        self.frames_per_session, self.roll_frames = frames_per_session, roll_frames
        self.slots = [SlotState() for _ in range(slots)]
        self._live = np.zeros(slots, bool)
        self._reset = np.zeros(slots, bool)
        # reset since their last session closed, and nothing written since (an open needs no
        # reset); closed, their clean still to plan (in close order); opened clean, not planned
        self._clean = np.zeros(slots, bool)
        self._cleaning: dict[int, None] = {}
        self._fresh: list[int] = []
        self._session = np.zeros(slots, np.int64)
        self._frames = np.zeros(slots, np.int64)
        self._rolled = np.zeros(slots, np.int64)
        self._prompt_len = np.zeros(slots, np.int64)
        self._forcing: set[int] = set()          # slots with tool tokens still to force
        self.starts = StartQueue()
        self._sessions = 0
        self._beat = 0

    # -- session lifecycle --------------------------------------------------------------------------
    def open(self, slot: int, tokens: list[int], spec: Any = None) -> int:
        """The slot starts a new session with this prompt; returns its session number."""
        self._sessions += 1
        self.slots[slot] = SlotState("starting", list(tokens), spec=spec)
        clean = bool(self._clean[slot])
        self._clean[slot] = False
        self._cleaning.pop(slot, None)          # closed and reopened before its clean: a reset
        if clean:
            self._fresh.append(slot)
        self._set(slot, live=False, reset=not clean, session=self._sessions,
                  prompt_len=len(tokens))
        self._forcing.discard(slot)
        # after its reset: a copy, a wait for the same prompt's rows, or rows (at a plan)
        self._placing.pop(slot, None)           # a reopened slot starts after the others
        self._placing[slot] = None if self.snapshots is None else self.snapshots.key(tokens)
        return self._sessions

    def close(self, slot: int) -> None:
        self._placing.pop(slot, None)
        if self.snapshots is not None:
            key = self.snapshots.key(self.slots[slot].prompt)
            if self.snapshots.pending.get(key) == slot:   # a slot waiting on it prefills instead
                del self.snapshots.pending[key]
        self.slots[slot] = SlotState()
        if slot in self._fresh:
            self._fresh.remove(slot)
        self._clean[slot] = False
        if self.shape.cleans:
            self._cleaning[slot] = None
        self._set(slot, live=False, reset=False, session=0, prompt_len=0)
        self._forcing.discard(slot)
        self.starts.close(slot)

    def _set(self, slot: int, live: bool, reset: bool, session: int, prompt_len: int) -> None:
        self._live[slot], self._reset[slot] = live, reset
        self._session[slot], self._prompt_len[slot] = session, prompt_len
        self._frames[slot] = self._rolled[slot] = 0

    def force(self, slot: int, ids: list[int]) -> None:
        """Tool-result tokens to force into the slot's function channel, one per frame."""
        if self.slots[slot].phase != "closed" and ids:
            self.slots[slot].forced.extend(ids)
            self._forcing.add(slot)

    def phase(self, slot: int) -> str:
        return self.slots[slot].phase

    def occupancy(self, pending=()) -> tuple[int, int]:
        """(live, starting) sessions: what an admission test weighs. `pending`: the (kind, slot)
        opens and closes asked since the last plan, in order; they apply at the next one, so
        the test weighs the book as they will leave it (a burst of opens in one beat counts)."""
        after = {slot: kind for kind, slot in pending if kind in ("open", "close")}
        live = int(self._live.sum())
        starting = sum(s.phase != "closed" for s in self.slots) - live
        for slot, kind in after.items():
            phase = self.slots[slot].phase
            live -= phase == "live"
            starting += (kind == "open") - (phase == "starting")
        return live, starting

    def clean_slots(self) -> np.ndarray:
        """Slots reset since their last session closed, and not reopened: an open there needs
        no reset (the slot's owner prefers them)."""
        return np.flatnonzero(self._clean)

    def ready(self, slot: int) -> bool:
        return bool(self._live[slot])

    def context(self, slot: int) -> int:
        """Frames the slot's caches hold past its prompt and warm-up."""
        return int(self._frames[slot] - self._rolled[slot])

    # -- one beat -----------------------------------------------------------------------------------
    def _forced(self, idx: np.ndarray, live: list[int]) -> np.ndarray:
        """The beat's forced tokens [live, frames] (-1: none): each live slot's queued tool
        tokens, a frame's worth taken from its queue."""
        forced = np.full((len(live), FRAMES_PER_BEAT), -1, np.int64)
        if self._forcing:
            forcing = sorted(self._forcing)
            for r, i in zip(np.searchsorted(idx, forcing).tolist(), forcing):
                if r < len(live) and live[r] == i:
                    q = self.slots[i].forced
                    for f in range(min(FRAMES_PER_BEAT, len(q))):
                        forced[r, f] = q.popleft()
                    if not q:
                        self._forcing.discard(i)
        return forced

    def plan(self, time_left_s: float) -> BookPlan:
        idx = np.flatnonzero(self._live)
        room_of = getattr(self.policy, "start_room", None)
        # seconds of start work the beat has room for (None: the policy does not budget it)
        room = None if room_of is None else room_of(len(idx), time_left_s)
        frame0 = self._frames[idx]
        context = frame0 - self._rolled[idx]
        must, early = self._rolling(idx, context)
        if room is not None:                  # a roll that must run now is paid for first
            room -= len(must) * self.policy.roll_s
        resets: list[int] = []
        if self._reset.any():
            resets = np.flatnonzero(self._reset).tolist()
            if room is not None:           # a reset waits for a beat with room, and its start
                cost = self.policy.reset_est
                fit = max(0, int(room / cost + 1e-9)) if cost else len(resets)
                resets = resets[:fit]
                room -= len(resets) * cost
            self._reset[resets] = False
        cleans = list(itertools.islice(self._cleaning, self.shape.cleans))
        for slot in cleans:
            del self._cleaning[slot]
        self._clean[cleans] = True
        live = idx.tolist()
        forced = self._forced(idx, live)
        empty = not live
        plan = BookPlan(
            self._beat, resets, live, forced, self._session[idx], frame0,
            (0 if empty else int((self._prompt_len[idx] + context).max())) + FRAMES_PER_BEAT,
            (0 if empty else int(context.max())) + self.shape.warmup_positions
            + FRAMES_PER_BEAT,
            context, opened={i: self.slots[i].spec for i in resets + self._fresh}, cleans=cleans)
        self._fresh = []
        self._beat += 1
        self._frames[idx] += FRAMES_PER_BEAT
        if room is None:                      # a policy that only says whether rows ride
            self._roll(plan, must, early)
            if self._placing:
                self._place_starts(plan)
            rows = (self.shape.start_rows if self.starts.running
                    and self.policy.carry_rows(len(live), time_left_s) else 0)
        else:
            room = self._place_within(plan, room, must, early)
            rows = self.policy.rows_in(room, self.shape.row_captures) if self.starts.running \
                else 0
            self.policy.held(bool(self.starts.running and not rows),
                             int(self._reset.sum()), self._copies_waiting())
        if self.starts.running and rows:
            carry_start_rows(self.slots, self.starts, self.shape, plan, rows)
            if self.snapshots is not None:
                self._keep_snapshots(plan)
        for i in self.starts.going_live():
            self.slots[i].phase = "live"          # in the beats from the next one on
            self._live[i] = True
        return plan

    def _place_within(self, plan: BookPlan, room: float, must: np.ndarray,
                      early: np.ndarray) -> float:
        """Snapshot copies and the early rolls within `room` (resets and the rolls that must
        run are paid for already); what room is left. A copy starts a caller who is waiting,
        an early roll only spreads work that could run a few beats later: the copies take the
        room first, and the early rolls that no longer fit beside them wait for a later beat
        (the emptiest first). Only those: in a beat with no room at all the early rolls still
        run, or sessions that started together would all roll in one beat."""
        roll_s, copy_s = self.policy.roll_s, self.policy.copy_est
        free = room - len(early) * roll_s          # room beside every early roll
        if self._placing:
            most = None if not copy_s else max(0, int(room / copy_s + 1e-9))
            self._place_starts(plan, most)
        spent = len(plan.copies) * copy_s
        over = max(0.0, spent - max(0.0, free))
        drop = min(len(early), int(np.ceil(over / roll_s - 1e-9))) if roll_s else 0
        self._roll(plan, must, early[:len(early) - drop])
        return room - spent - (len(early) - drop) * roll_s

    def _roll(self, plan: BookPlan, must: np.ndarray, early: np.ndarray) -> None:
        """The slots that roll after the plan's frames, in ascending order."""
        rolling = np.sort(np.concatenate([must, early]).astype(np.int64))
        plan.roll = list(zip(rolling.tolist(), self._prompt_len[rolling].tolist()))
        plan.roll_frames = self.roll_frames if plan.roll else 0
        self._rolled[rolling] += self.roll_frames

    def _waits(self, slot: int, key: str) -> bool:
        """Whether an opened slot waits for the snapshot another slot's rows are making."""
        index = self.snapshots
        return index.pending.get(key, slot) != slot and index.fits(len(self.slots[slot].prompt))

    def _copies_waiting(self) -> int:
        """Reset slots that would start by a snapshot copy now but wait for room."""
        if self.snapshots is None:
            return 0
        return sum(not self._reset[slot] and not self._waits(slot, key)
                   and self.snapshots.find(self.slots[slot].prompt, count=False) is not None
                   for slot, key in self._placing.items())

    def _place_starts(self, plan: BookPlan, most_copies: int | None = None) -> None:
        """Opened slots (reset in this plan or before) start: from their prompt's snapshot (a
        copy; live from the next beat), from a prefix's snapshot (a copy, then rows for the
        rest), after the rows of another slot with the same prompt (they wait for its
        snapshot), or by rows. In open order; past `most_copies` copies (the start policy's
        budget), a slot that would copy waits for the next beat."""
        index = self.snapshots
        for slot, key in list(self._placing.items()):
            s = self.slots[slot]
            if self._reset[slot]:
                continue                         # its reset waits for room: its start too
            if index is None:
                del self._placing[slot]
                self.starts.open(slot)
                continue
            if self._waits(slot, key):
                continue                         # the same prompt's snapshot is being made
            if most_copies is not None and len(plan.copies) >= most_copies \
                    and index.find(s.prompt, count=False) is not None:
                continue
            del self._placing[slot]
            snap = index.find(s.prompt)
            self.starts.open(slot)
            if snap is not None:
                plan.copies.append((slot, snap.entry, snap.positions))
                s.prompt_done = snap.positions
            if s.prompt_done >= len(s.prompt):
                self.starts.finished(slot)
                plan.started.append(slot)
                continue
            if snap is None:
                s.save_at = index.shared_prefix(
                    s.prompt, [self.slots[i].prompt for i in index.pending.values()])
            index.pending[key] = slot

    def _keep_snapshots(self, plan: BookPlan) -> None:
        """After this plan's rows: a finished prompt's state, and a shared prefix's as the rows
        pass its end, are kept (saved by the executor behind the rows)."""
        index, done = self.snapshots, set(plan.started)
        for slot, _, _ in plan.rows:
            s = self.slots[slot]
            if s.save_at and s.prompt_done == s.save_at:
                snap = index.reserve(s.prompt[:s.save_at])
                if snap is not None:
                    plan.saves.append((slot, snap.entry, snap.positions))
            if slot in done:
                index.pending.pop(index.key(s.prompt), None)
                snap = index.reserve(s.prompt)
                if snap is not None:
                    plan.saves.append((slot, snap.entry, snap.positions))

    def _rolling(self, live: np.ndarray, context: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The live slots that roll after this beat's frames (the executor queues the roll
        behind the beat's device work), for the next beat's: (must, early). Must: every slot
        whose next beat would pass `frames_per_session`. Early, spread over the beats before:
        a few that are within `roll_frames` of it (the fullest first, the higher slot first
        among equals), as many a beat as the live slots need on average. Sessions that started
        together would otherwise all roll in the same beat, and one beat would move every
        session's cache rows."""
        fps, drop = self.frames_per_session, self.roll_frames
        ahead = context + 2 * FRAMES_PER_BEAT
        must = live[ahead > fps]
        spread = -(-FRAMES_PER_BEAT * len(live) // drop) if drop else 0
        room = max(0, spread - len(must))
        early = live[:0]
        if room:
            near = (fps - drop < ahead) & (ahead <= fps) & (context >= drop)
            if near.any():
                slots, c = live[near], context[near]
                early = slots[np.lexsort((slots, c))[::-1][:room]]  # (context, slot) descending
        return must, early

    def observe(self, plan: BookPlan, seconds: float | None) -> None:
        """What the executor measured for the plan: the whole beat, start rows included."""
        if seconds is None or not (plan.live or plan.rows):
            return
        beat = getattr(self.policy, "observe_beat", None)
        if beat is None:
            self.policy.observe(len(plan.live), bool(plan.rows), seconds)
        else:
            beat(len(plan.live), self.shape.capture_for(len(plan.rows)) if plan.rows else 0,
                 len(plan.copies), len(plan.resets), len(plan.roll), seconds)
