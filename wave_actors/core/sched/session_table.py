"""The session table: who holds which slot, under which generation. One per clock incarnation,
held by the clock's `Slots` (wave_actors/clock/slots.py); everything else holds a `Handle`.

A slot's generation changes every time it is admitted, and generations never repeat within a
node: a table starts its count at its `epoch` (the clock's incarnation) shifted past any count
one incarnation can reach. A message naming a handle whose generation is not its slot's current
one (a release, frames or tool tokens of a session that is gone, or of an earlier incarnation)
is rejected and counted in `stale`, so nothing stale can touch the slot's next session.

Each slot also has the session's jitter buffer and counts (`jitter_arrays.ArrayScheduler`: the
rules of `jitter.BeatScheduler` as array operations, shedding its standing excess by `shedding`;
None keeps a fixed buffer), and each entry its `owner`: whatever the node gave at admission to
route the outputs to.

With a shared ring of frames (`shared_frames`, the engine process's) the session workers write
each frame into its slot's ring and no message carries it: `pull_ring` queues what they wrote,
each slot's next frame number while the ring holds it, at every release.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from wave_actors.core.contract import BeatInput, Handle
from wave_actors.core.sched.jitter import CapacityError, Shedding, SlotStats
from wave_actors.core.sched.frame_places import RingPlaces
from wave_actors.core.sched.jitter_arrays import ArrayPlan, ArrayScheduler

EPOCH_SHIFT = 40            # 2^40 admissions per incarnation before generations could meet
# Frames reach the clock in batches (wave_actors/clock/frame_batch.py), each row naming the session's
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
                 shedding: Shedding | None = Shedding(), ring=None):
        """`ring`: a `shared_frames.FrameRing` the frames' samples are written into (by the
        session workers, or here for frames that come with theirs)."""
        # Each slot's current generation (-1: free), for checking a batch of frames at once.
        self.generations = np.full(slots, -1, np.int64)
        self._free = list(range(slots - 1, -1, -1))      # pop() gives the lowest slot
        places = RingPlaces(ring, self.generations) if ring is not None else None
        self.jitter = ArrayScheduler(self.generations, prebuffer, max_queue, shedding, places)
        self.ring = ring
        # With a ring: each slot's next frame number to look for in it (a session numbers its
        # frames from 0, one after another).
        self.next_in = np.zeros(slots, np.int64)
        self.entries: dict[int, Entry] = {}         # slot → its session, admitted to released
        self._next_generation = epoch << EPOCH_SHIFT
        self.stale = 0                              # messages naming a handle not current

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def __len__(self) -> int:
        return len(self.entries)

    def admit(self, key: Any, owner: Any, prefer=None) -> Handle:
        """A free slot (the lowest of `prefer` where one is free, else the lowest) under a new
        generation; CapacityError when none is free."""
        slot = self._take_slot(prefer)
        self._next_generation += 1
        handle = Handle(slot, self._next_generation)
        self.entries[slot] = Entry(handle, key, owner)
        self.generations[slot] = handle.generation
        self.next_in[slot] = 0
        self.jitter.open(slot)
        return handle

    def _take_slot(self, prefer) -> int:
        if not self._free:
            raise CapacityError(f"all {len(self.generations)} slots are busy")
        if prefer is not None and len(prefer):
            fits = prefer[self.generations[prefer] < 0]
            if len(fits):
                slot = int(fits.min())
                self._free.remove(slot)
                return slot
        return self._free.pop()

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
        if self.ring is not None:               # what it wrote is counted like what it sent
            self.pull_ring(np.array([handle.slot]))
        stats = self.jitter.release(handle.slot)
        del self.entries[handle.slot]
        self.generations[handle.slot] = -1
        self._free.append(handle.slot)
        self._free.sort(reverse=True)
        return stats

    def push(self, handle: Handle, frame_no: int, pcm: np.ndarray) -> bool:
        if self.current(handle) is None:
            return False
        self.jitter.push(handle.slot, frame_no, pcm)
        if self.ring is not None:
            self.next_in[handle.slot] = max(self.next_in[handle.slot], frame_no + 1)
        return True

    def push_batch(self, slots: np.ndarray, generations: np.ndarray, frame_nos: np.ndarray,
                   pcm: np.ndarray | list[np.ndarray] | None) -> int:
        """`push` for a batch of frames, their handles checked as arrays: the frames of current
        handles queue in their slots; returns how many were refused (stale, counted). `pcm`:
        the rows' samples, or their pieces in row order; None: they are in the ring."""
        if len(slots) and 0 <= slots.min() and slots.max() < len(self.generations):
            current = self.generations[slots] == generations
            if self.ring is not None:               # not one the ring brought already
                current &= frame_nos >= self.next_in[slots]
            if current.all():                       # the usual batch: nothing stale
                self._push(slots, frame_nos, pcm)
                return 0
        known = (slots >= 0) & (slots < len(self.generations))
        current = known.copy()
        current[known] = self.generations[slots[known]] == generations[known]
        if self.ring is not None:
            current[known] &= frame_nos[known] >= self.next_in[slots[known]]
        refused = len(current) - int(current.sum())
        self.stale += refused
        if isinstance(pcm, list):
            pcm = np.concatenate(pcm)
        self._push(slots[current], frame_nos[current], None if pcm is None else pcm[current])
        return refused

    def _push(self, slots: np.ndarray, frame_nos: np.ndarray, pcm) -> None:
        self.jitter.push_batch(slots, frame_nos, pcm)
        if self.ring is not None and len(slots):
            np.maximum.at(self.next_in, slots, frame_nos + 1)

    def pull_ring(self, slots: np.ndarray | None = None) -> int:
        """Queues, in order, the frames the workers wrote into the ring since the last pull:
        each held slot's next frame while its place holds that frame of the slot's session.
        A place that holds a frame a lap or more further on means the frames between were
        written over before they were pulled: they are counted as dropped (as a full buffer
        drops its oldest) and the pull goes on from the oldest the ring still holds. Returns
        the frames queued. `slots`: these only (else every held one)."""
        ring = self.ring
        slots = np.flatnonzero(self.generations >= 0) if slots is None else slots
        pulled = 0
        while len(slots):
            want = self.next_in[slots]
            places = ring.places(slots, want)
            number = ring.number[places]
            mine = ring.generation[places] == self.generations[slots]
            ok = mine & (number == want)
            lapped = mine & (number >= want + ring.ring)
            if lapped.any():
                over = slots[lapped]
                oldest = number[lapped] - ring.ring + 1
                self.jitter.count_overwritten(over, oldest - want[lapped])
                self.next_in[over] = oldest
            if ok.any():
                self.jitter.push_batch(slots[ok], want[ok], None)
                self.next_in[slots[ok]] = want[ok] + 1
                pulled += int(ok.sum())
            slots = slots[ok | lapped]
        return pulled

    def pack(self, inp: BeatInput, in_beat: list[int], gather: bool = True) -> ArrayPlan:
        """Two frames of every slot in the beat into `inp` (the executor's ring slot); with a
        ring and `gather=False`, where they lie in it (`inp.frames`)."""
        return self.jitter.pack(inp, in_beat, gather)

    def complete(self, plan: ArrayPlan, late: bool) -> Routed:
        """The slots still held by the session they were packed for, with each one's first
        output frame (a slot released, or released and re-admitted, mid-beat gets nothing)."""
        return Routed(*self.jitter.complete(plan, late))

    def peek(self, plan: ArrayPlan) -> Routed:
        """What `complete` would route now, accounting for nothing: for a beat's first frame,
        routed while the rest still computes."""
        return Routed(*self.jitter.held_by(plan))

    def entries_of(self, routed: Routed) -> list[tuple[Entry, int]]:
        """(entry, first output frame) of each routed slot."""
        return [(self.entries[slot], first)
                for slot, first in zip(routed.slots.tolist(), routed.firsts.tolist())]
