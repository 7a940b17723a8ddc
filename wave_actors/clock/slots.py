"""The clock's slots, with one owner: who holds each slot and under which generation (the session
table, with each session's jitter buffer) and what the model does with it (the slot book:
phases, prompts, forced tool tokens, the beat's plan). The clock, the routes and the engine
process read them here; nothing else keeps a copy.

Changes (an admission, a release, tool tokens) are asked at any time but reach the book only at
a beat boundary (`plan`), so an executor never sees a slot change under a running beat. A
release frees the table's slot at once (a new session may take it) and the book's at the next
boundary; an open or tool tokens whose handle is no longer current by then are dropped.

An open whose whole prompt has a kept snapshot is ready when admitted: its start is one copy
in the next beat with room, so its `opened` need not wait for that beat (the audio it is sent
meanwhile waits in its jitter buffer, as a prebuffer's does). A few such starts at a time
(PROMISED_MAX): more than a loaded beat has room for would leave their audio queued for
beats. The rest, and every start that needs prompt rows, are ready once planned.
"""
from __future__ import annotations

import asyncio
from typing import Any

from wave_actors.core.contract import Executor, Handle
from wave_actors.core.sched.clock_policy import ClockPolicy
from wave_actors.core.sched.jitter import AdmissionRefused, SlotStats
from wave_actors.core.sched.session_table import SessionTable
from wave_actors.core.sched.slot_book import BookPlan, SlotBook
from wave_actors.core.sched.snapshots import snapshot_index
from wave_actors.core.sched.start_policy import StartPolicy, admission

PROMISED_MAX = 8


def promised(index, tokens, waiting: int) -> bool:
    """Whether an open of `tokens` is ready when admitted, with `waiting` starts not yet planned
    ahead of it: its whole prompt's snapshot is kept (made the most recently used) and fewer
    than PROMISED_MAX wait. The fast simulator asks the same."""
    return waiting < PROMISED_MAX and index is not None and index.hold(tokens)


class Slots:
    def __init__(self, executor: Executor, epoch: int, policy: ClockPolicy,
                 start_policy: StartPolicy, frames_ring=None):
        opts = executor.options
        self.table = SessionTable(executor.max_sessions, epoch, policy.prebuffer, policy.max_queue,
                                  policy.shedding, frames_ring)
        self.book = SlotBook(executor.max_sessions, executor.start_shape, start_policy,
                             opts.frames_per_session, opts.roll_frames,
                             snapshot_index(executor, executor.start_shape.prefill_chunk))
        for know, fact in (("know_rows", "start_row_s"), ("know_beats", "beat_at_context_s")):
            learn, measured = getattr(start_policy, know, None), getattr(executor, fact, None)
            if learn is not None and measured:     # what the executor measured at build
                learn(measured)
        self._ops: list[tuple] = []                # changes for the next beat boundary
        self._ready: dict[Handle, asyncio.Future] = {}    # admitted, start not done yet
        self._promised: set[Handle] = set()    # ready when admitted, start not planned yet

    # -- asked between beats ----------------------------------------------------------------------
    def admit(self, key: Any, owner: Any, tokens: list[int], spec: Any) -> Handle:
        """A slot for a new session, its prompt planned in at the next boundary. Raises
        `AdmissionRefused` when the start policy says no, `CapacityError` when full."""
        if self.table.free_slots:                  # full: the table says so below
            pending = [(kind, h.slot) for kind, h, _ in self._ops]
            why = admission(self.book.policy, *self.book.occupancy(pending), len(self.book.slots))
            if why:
                raise AdmissionRefused(why)
        # a slot cleaned since its last session (behind a beat) starts with no reset in its beat
        handle = self.table.admit(key, owner, prefer=self.book.clean_slots())
        self._ops.append(("open", handle, (tokens, spec)))
        if promised(self.book.snapshots, tokens, len(self._ready) + len(self._promised)):
            self._promised.add(handle)           # `when_ready`: done, while it is current
        else:
            self._ready[handle] = asyncio.get_running_loop().create_future()
        return handle

    def release(self, handle: Handle) -> SlotStats | None:
        """Frees the session's slot; its stats, or None for a stale handle (counted)."""
        fut = self._ready.pop(handle, None)
        if fut is not None and not fut.done():
            fut.set_result(False)
        self._promised.discard(handle)
        stats = self.table.release(handle)
        if stats is not None:
            self._ops.append(("close", handle, None))
        return stats

    def force(self, handle: Handle, ids: list[int]) -> None:
        """Tool-result tokens for the session to hear, from the next boundary."""
        self._ops.append(("func", handle, ids))

    def current(self, handle: Handle) -> bool:
        """The handle is its slot's session now (not an earlier one; not counted as stale)."""
        entry = self.table.entries.get(handle.slot)
        return entry is not None and entry.handle == handle

    def holds(self, handle: Handle) -> bool:
        """The handle's slot is held (by this session or, for an old handle, a later one)."""
        return handle.slot in self.table.entries

    def when_ready(self, handle: Handle) -> asyncio.Future:
        """Resolves (True) once this admitted session's prompt is planned in (its frames run
        from the next beat on), or at once where its start is one snapshot copy (promised).
        False when the session was released first (or the handle is not this table's)."""
        fut = self._ready.get(handle)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(self.current(handle))
        return fut

    def forget_waiters(self) -> None:
        """The clock stops: every opener waiting for a start learns at once that it is gone."""
        for fut in self._ready.values():
            if not fut.done():
                fut.set_result(False)
        self._ready.clear()

    # -- at a beat boundary -----------------------------------------------------------------------
    def plan(self, time_left_s: float) -> BookPlan:
        """The changes asked since the last boundary, in order, then the beat's plan."""
        self._apply()
        plan = self.book.plan(time_left_s)
        for handle in [h for h in self._ready if self.book.ready(h.slot)]:
            fut = self._ready.pop(handle)
            if not fut.done():
                fut.set_result(True)
        self._promised = {h for h in self._promised
                          if self.current(h) and not self.book.ready(h.slot)}
        return plan

    def _apply(self) -> None:
        """A close always applies (the table freed the slot when it was asked); an open or tool
        tokens only while their handle is still current."""
        ops, self._ops = self._ops, []
        for kind, handle, arg in ops:
            if kind == "close":
                if handle.slot not in self.table.entries:
                    self.book.close(handle.slot)
            elif self.table.current(handle) is None:
                continue
            elif kind == "open":
                self.book.open(handle.slot, *arg)
            elif kind == "func":
                self.book.force(handle.slot, arg)

    @property
    def free(self) -> int:
        return self.table.free_slots

    @property
    def jitter_totals(self) -> SlotStats:
        """Underruns and drops over every session this table admitted."""
        return self.table.jitter.totals
