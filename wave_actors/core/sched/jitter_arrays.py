"""The beat scheduler on arrays: `jitter.BeatScheduler`'s rules, a beat's work as numpy
operations over all slots instead of Python per slot.

The clock packs every live session each beat; at a few hundred sessions a Python loop per slot
(queue pops, a copy per frame, counters, the shedding window) is most of the host's time before
the device can start. Here each slot's jitter buffer is a ring of places (`place`, `nums`:
where each queued frame's samples are and its number, `head`/`count` per slot), the counters are
columns of one table, and the shedding window's spares are a ring per slot whose minimum is one
reduction (`LowWaters`). A batch of frames from a session worker is queued with one scatter.

The samples live in one `FrameStore` whose free places are reused last-freed first (the memory
a beat touches is about the frames queued, not every slot's whole buffer), or where the session
workers wrote them (`RingPlaces`: a place fixed by slot and frame number in a shared ring): a
batch then brings only headers, and a frame whose place was written again before its beat is
heard as silence and counted as dropped.

`BeatScheduler` stays the plain reference: `tests/runtime/test_jitter_arrays.py` drives both
with the same random pushes, beats and releases and requires the same frames, silences,
counters and shedding, step by step.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterable

import numpy as np

from wave_actors.core.contract import BeatInput
from wave_actors.core.frames import FRAMES_PER_BEAT, SILENCE
from wave_actors.core.sched.frame_places import FramesToRead, FrameStore, RingPlaces
from wave_actors.core.sched.jitter import Shedding, SlotStats
from wave_actors.core.sched.low_waters import LowWaters

assert FRAMES_PER_BEAT == 2, "pack() takes a beat's two frames as two array steps"

_STAT = {f.name: i for i, f in enumerate(fields(SlotStats))}
_IN, _OUT, _UNDER, _IDLE, _DROP, _SHED, _LATE = (
    _STAT[n] for n in ("frames_in", "frames_out", "underruns", "idle_frames", "dropped", "shed",
                       "late_beats"))


@dataclass
class ArrayPlan:
    """What one `pack` put where: the slots packed (ascending), each one's two frame numbers
    (SILENCE for silence) and its generation, so `complete` can tell whether the session
    packed still holds the slot."""
    beat: int
    slot_idx: np.ndarray        # [k] int
    nums: np.ndarray            # [k, 2] int
    generations: np.ndarray     # [k] int

    @property
    def slots(self) -> list[int]:
        return self.slot_idx.tolist()

    @property
    def frames(self) -> dict[int, tuple[int, int]]:
        return {s: (a, b) for s, (a, b) in zip(self.slot_idx.tolist(), self.nums.tolist())}


class ArrayScheduler:
    def __init__(self, generations: np.ndarray, prebuffer: int = 3, max_queue: int = 50,
                 shedding: Shedding | None = Shedding(), ring: RingPlaces | None = None):
        """`generations`: each slot's current generation, -1 while it is free: the session
        table's, which alone admits and releases (`open` and `release` here follow it).
        `shedding=None` keeps the delay a slot grows to for the rest of its call; `ring`: the
        samples are in a shared ring of frames, not in a store of the scheduler's."""
        assert prebuffer >= 1 and max_queue >= prebuffer + FRAMES_PER_BEAT
        n, q = len(generations), max_queue
        self.generations = generations
        self.max_sessions, self.prebuffer, self.max_queue = n, prebuffer, q
        self.shedding = shedding
        # Room to start with for every slot's prebuffer and a beat; grows to what is queued.
        self._ring = ring
        self.store = ring or FrameStore(n * (prebuffer + FRAMES_PER_BEAT), n * q)
        self.overwritten = 0    # frames whose ring place was written again before their beat
        self.place = np.zeros((n, q), np.int64)      # each queued frame's place in the store
        self.nums = np.zeros((n, q), np.int64)
        self.head = np.zeros(n, np.int64)            # ring index of a slot's oldest frame
        self.count = np.zeros(n, np.int64)           # frames queued
        self.started = np.zeros(n, bool)
        self.out_frame = np.zeros(n, np.int64)
        self.stats = np.zeros((n, len(_STAT)), np.int64)
        self.low = LowWaters(n, shedding) if shedding else None    # the shedding windows
        self._ready = np.zeros(n, bool)
        self._mark = np.zeros(n, np.int64)           # scratch: is a batch a row a slot?
        self._rows = np.arange(n, dtype=np.int64)
        self.beat = 0
        self.totals = SlotStats()       # over every session ever admitted, closed ones included

    # -- a slot's sessions ---------------------------------------------------------------------
    @property
    def held(self) -> np.ndarray:
        """Which slots a session holds: bool [slots]."""
        return self.generations >= 0

    def open(self, slot: int) -> None:
        """The table admitted a session to `slot`: its buffer and counts start empty."""
        self._check(slot)
        self.head[slot] = self.count[slot] = self.out_frame[slot] = 0
        if self.low:
            self.low.clear(slot)
        self.stats[slot] = 0
        self.started[slot] = False

    def release(self, slot: int) -> SlotStats:
        """The table is releasing `slot` (still held): what it queued is counted as dropped."""
        self._check(slot)
        queue = self._queue(slot)
        self.store.give(self.place[slot, queue])
        self.stats[slot, _DROP] += len(queue)     # queued but never heard: counted, not lost
        self.totals.dropped += len(queue)
        self.count[slot] = 0
        return self.slot_stats(slot)

    def _check(self, slot: int) -> None:
        if not (0 <= slot < self.max_sessions and self.generations[slot] >= 0):
            raise KeyError(slot)

    def slot_stats(self, slot: int) -> SlotStats:
        return SlotStats(*self.stats[slot].tolist())

    def queued(self, slot: int) -> list[int]:
        """The frame numbers in the slot's buffer, oldest first."""
        return self.nums[slot, self._queue(slot)].tolist()

    def queued_pcm(self, slot: int) -> np.ndarray:
        """The frames in the slot's buffer, oldest first: [queued, SAMPLES_IN]."""
        return self.store.pcm[self.place[slot, self._queue(slot)]]

    def _queue(self, slot: int) -> np.ndarray:
        self._check(slot)
        return (self.head[slot] + np.arange(self.count[slot])) % self.max_queue

    # -- frames in ------------------------------------------------------------------------------
    def push(self, slot: int, frame_no: int, pcm: np.ndarray) -> None:
        self._check(slot)
        self.push_batch(np.array([slot]), np.array([frame_no]), pcm[None])

    def push_batch(self, slots: np.ndarray, frame_nos: np.ndarray,
                   pcm: np.ndarray | list[np.ndarray] | None) -> None:
        """`push` of each row in order, as one scatter: rows of held slots only. `pcm` is the
        rows' samples, or pieces of them in row order (the messages a batch was read in): each
        frame's samples are copied once, straight into its place. None: they are in the ring
        already (a worker wrote them there)."""
        k = len(slots)
        if not k:
            return
        free = self.generations[slots] < 0
        if free.any():
            raise KeyError(slots[free][0])
        q = self.max_queue
        if k <= self.max_sessions:
            rows = self._rows[:k]
            self._mark[slots] = rows
            if (self._mark[slots] == rows).all():   # a row a slot, as most batches are
                self._push_distinct(slots, frame_nos, pcm)
                return
        slots = slots.astype(np.int64)
        order = np.argsort(slots, kind="stable")     # a slot's rows together, in batch order
        s = slots[order]
        starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
        sizes = np.diff(np.r_[starts, k])
        mine = s[starts]
        # Pushing one by one keeps a slot's last `q` frames: of a batch larger than that, only
        # its last `q` rows are queued, and the slot's queued frames make room oldest first.
        drop = np.maximum(0, self.count[mine] + sizes - q)
        drop_batch = np.maximum(0, sizes - q)
        self._drop_oldest(mine, drop - drop_batch)      # rare: a backlog overflows a buffer
        rank = np.arange(k) - np.repeat(starts, sizes) - np.repeat(drop_batch, sizes)
        keep = rank >= 0
        s, rank, rows = s[keep], rank[keep], order[keep]
        pos = (self.head[s] + self.count[s] + rank) % q
        if self._ring is not None:
            if pcm is not None:
                pcm = np.concatenate(pcm) if isinstance(pcm, list) else pcm
                pcm = pcm[rows]
            places = self._places(s, frame_nos[rows], pcm)
        else:
            places = self.store.take(len(s))
            dest = np.full(k, -1, np.int64)
            dest[rows] = places
            self._write(dest, pcm)
        self.place[s, pos] = places
        self.nums[s, pos] = frame_nos[rows]
        self.count[mine] += sizes - drop_batch
        self.stats[mine, _DROP] += drop
        self.totals.dropped += int(drop.sum())

    def _push_distinct(self, slots: np.ndarray, frame_nos: np.ndarray, pcm: np.ndarray) -> None:
        q = self.max_queue
        count = self.count[slots]
        if count.max() >= q:                  # the oldest frame of each full one makes room
            full = slots[count >= q]
            self._drop_oldest(full, np.ones(len(full), np.int64))
            self.stats[full, _DROP] += 1
            self.totals.dropped += len(full)
            count = self.count[slots]
        pos = (self.head[slots] + count) % q
        if self._ring is not None:
            if isinstance(pcm, list):
                pcm = np.concatenate(pcm)
            places = self._places(slots, frame_nos, pcm)
        else:
            places = self.store.take(len(slots))
            self._write(places, pcm)
        self.place[slots, pos] = places
        self.nums[slots, pos] = frame_nos
        self.count[slots] = count + 1

    def _drop_oldest(self, slots: np.ndarray, n: np.ndarray) -> None:
        """The oldest n[i] frames of each of `slots` (distinct) leave its queue and give back
        their places; the caller counts them."""
        head, q = self.head[slots], self.max_queue
        for f in range(int(n.max(initial=0))):
            some = n > f
            self.store.give(self.place[slots[some], (head[some] + f) % q])
        self.head[slots] = (head + n) % q
        self.count[slots] -= n

    def _places(self, slots: np.ndarray, frame_nos: np.ndarray, pcm: np.ndarray | None
                ) -> np.ndarray:
        """Places for frames to queue, in order, their samples written there (`pcm` None: in
        the ring already)."""
        if self._ring is None:
            places = self.store.take(len(slots))
            self.store.pcm[places] = pcm
            return places
        ring = self._ring.ring
        places = ring.places(slots, frame_nos)
        if pcm is not None:
            ring.write_rows(places, self._ring.generations[slots], frame_nos, pcm)
        return places

    def _write(self, dest: np.ndarray, pcm: np.ndarray | list[np.ndarray]) -> None:
        """Row i of `pcm` (one array or its pieces in order) into place dest[i] (-1: the row
        is not kept)."""
        a = 0
        for piece in pcm if isinstance(pcm, list) else [pcm]:
            b = a + len(piece)
            d = dest[a:b]
            if d.min(initial=0) >= 0:
                self.store.pcm[d] = piece
            else:
                keep = d >= 0
                self.store.pcm[d[keep]] = piece[keep]
            a = b
        assert a == len(dest), "the samples' rows are not the batch's"

    def target(self, slot: int) -> int | None:
        """The queue length, in frames, the slot's shedding is heading for (None: not yet known,
        or no shedding)."""
        self._check(slot)
        lowest = self.low.lowest(slot) if self.low else None
        if lowest is None:
            return None
        return int(self.count[slot]) - max(0, lowest - self.shedding.keep)

    # -- one beat -------------------------------------------------------------------------------
    def pack(self, inp: BeatInput, ready: Iterable[int] | None = None,
             gather: bool = True) -> ArrayPlan:
        """Fill `inp` for every held slot that is ready; returns what went where. With a ring,
        `gather=False` leaves the samples in it: `inp.frames` names where each row's lie."""
        inp.live[:] = False
        if ready is None:
            chosen = self.held
        else:
            self._ready[:] = False
            idx = np.fromiter(ready, np.int64)
            self._ready[idx[(idx >= 0) & (idx < self.max_sessions)]] = True
            chosen = self.held & self._ready
        slots = np.flatnonzero(chosen)
        inp.live[slots] = True
        q = self.max_queue
        count, head = self.count[slots], self.head[slots]
        started = self.started[slots] | (count >= self.prebuffer)
        self.started[slots] = started
        nums = np.full((len(slots), FRAMES_PER_BEAT), SILENCE, np.int64)
        taken = np.zeros(len(slots), np.int64)
        # Each packed row's two places (the silent one where it has no frame), over the span
        # of rows from the lowest packed slot to the highest (rows in it not packed hear
        # silence): the span is contiguous in `inp.audio`, so one gather fills it.
        lo = int(slots[0]) if len(slots) else 0
        span = np.full((int(slots[-1]) + 1 - lo if len(slots) else 0, FRAMES_PER_BEAT),
                       FrameStore.SILENT, np.int64)
        for f in range(FRAMES_PER_BEAT):
            have = started & (count > f)
            pos = (head + f) % q
            src, at = slots[have], pos[have]
            span[src - lo, f] = self.place[src, at]
            nums[have, f] = self.nums[src, at]
            taken += have
        if gather or self._ring is None:
            inp.frames = None
            np.take(self.store.pcm, span, axis=0, out=inp.audio[lo:lo + len(span)], mode="clip")
            if self._ring is not None:
                self._check_ring(inp, slots, nums, span, lo)
        else:
            inp.frames = FramesToRead.packed(self._ring, slots, nums, span, lo)
        self.store.give(span[span != FrameStore.SILENT])
        self.head[slots] = (head + taken) % q
        left = count - taken
        self.count[slots] = left
        missing = FRAMES_PER_BEAT - taken
        self.stats[slots, _IN] += taken
        self.stats[slots, _UNDER] += np.where(started, missing, 0)
        self.stats[slots, _IDLE] += np.where(started, 0, FRAMES_PER_BEAT)
        self.totals.frames_in += int(taken.sum())
        self.totals.underruns += int(missing[started].sum())
        self.totals.idle_frames += FRAMES_PER_BEAT * int((~started).sum())
        if self.shedding:
            self._shed(slots[started], left[started] - missing[started])
        plan = ArrayPlan(self.beat, slots, nums, self.generations[slots].copy())
        inp.beat = self.beat
        self.beat += 1
        return plan

    def count_overwritten(self, slots: np.ndarray, frames: np.ndarray) -> None:
        """Frames of these slots written over in the ring before they were queued: dropped."""
        np.add.at(self.stats[:, _DROP], slots, frames)
        n = int(frames.sum())
        self.totals.dropped += n
        self.overwritten += n

    def count_torn(self, frames: FramesToRead) -> int:
        """The frames an executor found written again when it read them: counted as dropped."""
        n = 0
        for slots, _f in frames.torn:
            # A slot taken by another session since the pack: its stats are that one's.
            same = self._ring.generations[slots] == frames.generations[slots]
            self.count_overwritten(slots[same], np.ones(int(same.sum()), np.int64))
            self.totals.dropped += int((~same).sum())
            self.overwritten += int((~same).sum())
            n += len(slots)
        return n

    def _check_ring(self, inp: BeatInput, slots: np.ndarray, nums: np.ndarray,
                    span: np.ndarray, lo: int) -> None:
        """After the gather: a packed frame whose ring place no longer holds it (written again
        meanwhile) is heard as silence and counted as dropped."""
        rows, f = np.nonzero(nums != SILENCE)
        s = slots[rows]
        ok = self._ring.ring.holds(span[s - lo, f], self._ring.generations[s], nums[rows, f])
        if ok.all():
            return
        bad_s, bad_f = s[~ok], f[~ok]
        inp.audio[bad_s, bad_f] = 0.0
        self.count_overwritten(bad_s, np.ones(len(bad_s), np.int64))

    def _shed(self, slots: np.ndarray, spare: np.ndarray) -> None:
        """Record this beat's spare of each started slot; drop the oldest frames its window shows
        were never needed."""
        slots, n = self.low.record(slots, spare, self.count[slots])
        if not n.any():
            return
        self._drop_oldest(slots, n)
        self.stats[slots, _SHED] += n
        self.stats[slots, _DROP] += n
        shed = int(n.sum())
        self.totals.shed += shed
        self.totals.dropped += shed

    def held_by(self, plan: ArrayPlan) -> tuple[np.ndarray, np.ndarray]:
        """(slots, first output frame of each) of the plan's slots still held by the session
        packed; nothing changes."""
        s = plan.slot_idx
        s = s[self.generations[s] == plan.generations]
        return s, self.out_frame[s].copy()

    def complete(self, plan: ArrayPlan, late: bool) -> tuple[np.ndarray, np.ndarray]:
        """Account for a finished beat. Returns (slots, first output frame index of each) for
        the slots still held by the session packed (a slot released, or released and
        re-admitted, mid-beat gets nothing: its outputs belong to nobody alive)."""
        s, firsts = self.held_by(plan)
        if late:
            self.stats[s, _LATE] += 1
        self.out_frame[s] += FRAMES_PER_BEAT
        self.stats[s, _OUT] += FRAMES_PER_BEAT
        self.totals.frames_out += FRAMES_PER_BEAT * len(s)
        return s, firsts
