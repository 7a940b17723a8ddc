"""The session table: who holds which slot, under which generation. One per clock incarnation,
owned by the clock; everything else holds a `Handle` and asks.

A slot's generation changes every time it is admitted, and generations never repeat within a
node: a table starts its count at its `epoch` (the clock's incarnation) shifted past any count
one incarnation can reach. A message naming a handle whose generation is not its slot's current
one (a release, frames or tool tokens of a session that is gone, or of an earlier incarnation)
is rejected and counted in `stale`, so nothing stale can touch the slot's next session.

Each slot also has the session's jitter buffer and counts (`jitter_arrays.ArrayScheduler`: the
rules of `jitter.BeatScheduler` as array operations, shedding its standing excess by `shedding`;
None keeps a fixed buffer), and each entry its `owner`: whatever the node gave at admission to
route the outputs to.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from wave_actors.core.contract import BeatInput, Handle
from wave_actors.core.jitter import CapacityError, Shedding, SlotStats
from wave_actors.core.jitter_arrays import ArrayPlan, ArrayScheduler

EPOCH_SHIFT = 40            # 2^40 admissions per incarnation before generations could meet
# Frames reach the clock in batches (wave_actors/frame_batch.py), each row naming the session's
# handle and the frame's number; this number marks the end of a closing session's frames.
END_OF_STREAM = -1

__all__ = ["CapacityError", "Entry", "END_OF_STREAM", "Routed", "SessionTable"]


@dataclass
class Entry:
    handle: Handle
    key: Any                # the node's name for the session (for logs and tests)
    owner: Any              # where its outputs go (the node's route of the session)


@dataclass
class Routed:
    """A finished beat's outputs that have a session to go to: the slots still held by the
    session they were packed for, and each one's first output frame."""
    slots: np.ndarray
    firsts: np.ndarray

    def __len__(self) -> int:
        return len(self.slots)


class SessionTable:
    def __init__(self, slots: int, epoch: int = 0, prebuffer: int = 3, max_queue: int = 50,
                 shedding: Shedding | None = Shedding()):
        self.jitter = ArrayScheduler(slots, prebuffer, max_queue, shedding)
        self.entries: dict[int, Entry] = {}         # slot → its session, admitted to released
        # Each slot's current generation (-1: free), for checking a batch of frames at once.
        self.generations = np.full(slots, -1, np.int64)
        self._next_generation = epoch << EPOCH_SHIFT
        self.stale = 0                              # messages naming a handle not current

    @property
    def free_slots(self) -> int:
        return self.jitter.free_slots

    def __len__(self) -> int:
        return len(self.entries)

    def admit(self, key: Any, owner: Any) -> Handle:
        """A free slot (the lowest) under a new generation; CapacityError when none is free."""
        slot = self.jitter.admit(key)
        self._next_generation += 1
        handle = Handle(slot, self._next_generation)
        self.entries[slot] = Entry(handle, key, owner)
        self.generations[slot] = handle.generation
        return handle

    def current(self, handle: Handle) -> Entry | None:
        """The handle's entry while it is current; None (and counted) when it is stale."""
        entry = self.entries.get(handle.slot)
        if entry is None or entry.handle != handle:
            self.stale += 1
            return None
        return entry

    def release(self, handle: Handle) -> SlotStats | None:
        """Frees the slot of a current handle (its queued frames counted as dropped); a stale
        handle frees nothing and gets None."""
        if self.current(handle) is None:
            return None
        del self.entries[handle.slot]
        self.generations[handle.slot] = -1
        return self.jitter.release(handle.slot)

    def push(self, handle: Handle, frame_no: int, pcm: np.ndarray) -> bool:
        if self.current(handle) is None:
            return False
        self.jitter.push(handle.slot, frame_no, pcm)
        return True

    def push_batch(self, slots: np.ndarray, generations: np.ndarray, frame_nos: np.ndarray,
                   pcm: np.ndarray | list[np.ndarray]) -> int:
        """`push` for a batch of frames, their handles checked as arrays: the frames of current
        handles queue in their slots; returns how many were refused (stale, counted). `pcm`:
        the rows' samples, or their pieces in row order."""
        if len(slots) and 0 <= slots.min() and slots.max() < len(self.generations):
            current = self.generations[slots] == generations
            if current.all():                       # the usual batch: nothing stale
                self.jitter.push_batch(slots, frame_nos, pcm)
                return 0
        known = (slots >= 0) & (slots < len(self.generations))
        current = known.copy()
        current[known] = self.generations[slots[known]] == generations[known]
        refused = len(current) - int(current.sum())
        self.stale += refused
        if isinstance(pcm, list):
            pcm = np.concatenate(pcm)
        self.jitter.push_batch(slots[current], frame_nos[current], pcm[current])
        return refused

    def pack(self, inp: BeatInput, in_beat: list[int]) -> ArrayPlan:
        """Two frames of every slot in the beat into `inp` (the executor's ring slot)."""
        return self.jitter.pack(inp, in_beat)

    def complete(self, plan: ArrayPlan, late: bool) -> Routed:
        """The slots still held by the session they were packed for, with each one's first
        output frame (a slot released, or released and re-admitted, mid-beat gets nothing)."""
        return Routed(*self.jitter.complete(plan, late))

    def entries_of(self, routed: Routed) -> list[tuple[Entry, int]]:
        """(entry, first output frame) of each routed slot."""
        return [(self.entries[slot], first)
                for slot, first in zip(routed.slots.tolist(), routed.firsts.tolist())]
