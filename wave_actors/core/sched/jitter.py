"""The beat scheduler: slots, per-slot jitter buffers, packing a beat and accounting for it.

Pure and synchronous (no asyncio, no torch, no sockets), written plainly, a slot at a time: the
reference for the clock's `jitter_arrays.ArrayScheduler`, which applies these rules as array
operations and is checked against this one step by step (`tests/runtime/test_jitter_arrays.py`);
the property tests of the rules themselves run here. Per live slot and beat:

  - frames arrive numbered 0, 1, 2 … from the slot's SessionActor and queue in a bounded jitter
    buffer (overflow drops the oldest frame, counted as `dropped`);
  - a slot starts consuming once `prebuffer` frames are queued (absorbs client jitter); before
    that it is `idle` and the model hears silence (counted as idle frames, not underruns);
  - once started, each beat takes two frames; a missing one becomes silence + `underruns`.

The buffer's delay adapts (the idea of WebRTC NetEq, without its time-stretching). It grows by
itself: an underrun plays silence, so every later frame is heard one frame later and the queue
holds exactly the delay the late arrival needed. It shrinks by shedding: after each beat a slot
records its `spare` (frames left queued, less any missing this beat). If over the last
`Shedding.window_beats` beats the lowest spare stayed above `Shedding.keep`, those frames were
never needed to ride out the recent jitter (a backlog delivered in a burst after a stall), so up to
`per_beat` of the oldest are shed, counted as `shed` and in `dropped`. The target delay is thus
the deepest dip the recent jitter caused plus `keep` frames of reserve.

Invariant (checked by the property tests): for every slot, the frame numbers handed to the backend
are strictly increasing, and every pushed frame is either handed over exactly once or counted in
`dropped` (shed, overflowed, or still queued when the slot is released).
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

import numpy as np

from wave_actors.core.contract import BeatInput
from wave_actors.core.frames import BEAT_S, FRAMES_PER_BEAT, SAMPLES_IN, SILENCE


class CapacityError(Exception):
    pass


class AdmissionRefused(CapacityError):
    """Slots are free, but the start policy's admission test refused the open (its reason
    says why): answered as `refused admission`, counted apart from `refused capacity`."""


@dataclass(frozen=True)
class Shedding:
    """When a slot sheds the queued audio that the recent jitter never used."""
    # Long enough to see ordinary network jitter's deepest dip several times (a dip shows once in
    # a few beats), short enough that a stall's backlog is gone within ~3 s of the burst.
    window_s: float = 2.0
    # Frames kept above the window's lowest point: a dip a frame deeper than any recently seen
    # still plays without an underrun, so shedding costs no underruns under steady jitter.
    keep: int = 1
    # Frames shed at most per beat: one beat's worth clears a 1.2 s backlog in ~8 beats, and the
    # audio skipped is a contiguous stretch (the stall's oldest), not every other frame.
    per_beat: int = FRAMES_PER_BEAT

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.keep < 0 or self.per_beat < 1:
            raise ValueError("Shedding needs window_s > 0, keep >= 0 and per_beat >= 1")

    @property
    def window_beats(self) -> int:
        return max(1, math.ceil(self.window_s / BEAT_S - 1e-9))


@dataclass
class SlotStats:
    frames_in: int = 0          # frames handed to the backend
    frames_out: int = 0         # output frames routed back
    underruns: int = 0          # silence substituted for a missing frame after the stream started
    idle_frames: int = 0        # silence while prebuffering (before the first frame arrived)
    dropped: int = 0            # frames pushed but never handed over (overflow, shed or close)
    shed: int = 0               # of `dropped`, those shed to bring the delay back down
    late_beats: int = 0         # beats this slot took part in that finished after the deadline

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class LowWater:
    """The lowest spare over a slot's last `window` beats, in O(1) amortised per beat.

    Spares are stored plus the frames shed before them (`shed_total`): shedding n frames lowers
    every past spare by n, which the lookup subtracts instead of rewriting the window."""

    def __init__(self, window: int):
        self.window = window
        self.beats = 0                  # beats recorded since the slot started
        self.shed_total = 0
        self._mins: collections.deque = collections.deque()   # (beat, spare + shed); values rise

    def record(self, spare: int) -> None:
        value = spare + self.shed_total
        while self._mins and self._mins[-1][1] >= value:
            self._mins.pop()
        self._mins.append((self.beats, value))
        self.beats += 1
        while self._mins[0][0] <= self.beats - 1 - self.window:
            self._mins.popleft()

    def lowest(self) -> int | None:
        """None until a whole window has been seen."""
        if self.beats < self.window:
            return None
        return self._mins[0][1] - self.shed_total


@dataclass
class Slot:
    key: object
    jitter: collections.deque = field(default_factory=collections.deque)
    started: bool = False
    out_frame: int = 0          # model frame index of the next output frame
    last_in: int = -1           # frame number of the last frame handed over
    stats: SlotStats = field(default_factory=SlotStats)
    low: LowWater | None = None     # None when the scheduler does not shed


@dataclass
class BeatPlan:
    beat: int
    slots: list[int]                        # live slots packed into this beat
    frames: dict[int, tuple[int, int]]      # slot -> the two frame numbers (SILENCE for silence)
    owners: dict[int, "Slot"] = field(default_factory=dict)   # who held the slot when packed


class BeatScheduler:
    def __init__(self, max_sessions: int, prebuffer: int = 3, max_queue: int = 50,
                 shedding: Shedding | None = Shedding()):
        """`shedding=None` keeps the delay a slot grows to for the rest of its call."""
        assert prebuffer >= 1 and max_queue >= prebuffer + FRAMES_PER_BEAT
        self.max_sessions = max_sessions
        self.prebuffer, self.max_queue = prebuffer, max_queue
        self.shedding = shedding
        self.slots: dict[int, Slot] = {}
        self._free = list(range(max_sessions - 1, -1, -1))      # pop() gives the lowest slot
        self.beat = 0
        self.totals = SlotStats()       # over every session ever admitted, closed ones included

    # -- admission ------------------------------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return len(self._free)

    def admit(self, key: object) -> int:
        if not self._free:
            raise CapacityError(f"all {self.max_sessions} slots are busy")
        slot = self._free.pop()
        low = LowWater(self.shedding.window_beats) if self.shedding else None
        self.slots[slot] = Slot(key, low=low)
        return slot

    def release(self, slot: int) -> SlotStats:
        s = self.slots.pop(slot)
        s.stats.dropped += len(s.jitter)      # queued but never heard: counted, not lost
        self.totals.dropped += len(s.jitter)
        self._free.append(slot)
        self._free.sort(reverse=True)
        return s.stats

    # -- frames in ------------------------------------------------------------------------------
    def push(self, slot: int, frame_no: int, pcm: np.ndarray) -> None:
        s = self.slots[slot]
        if len(s.jitter) >= self.max_queue:
            s.jitter.popleft()
            s.stats.dropped += 1
            self.totals.dropped += 1
        s.jitter.append((frame_no, pcm))

    def target(self, slot: int) -> int | None:
        """The queue length, in frames, the slot's shedding is heading for (None: not yet known,
        or no shedding)."""
        s = self.slots[slot]
        lowest = s.low.lowest() if s.low else None
        if lowest is None:
            return None
        return len(s.jitter) - max(0, lowest - self.shedding.keep)

    # -- one beat -------------------------------------------------------------------------------
    def pack(self, inp: BeatInput, ready: set[int] | None = None) -> BeatPlan:
        """Fill `inp` for every live slot that is ready; returns what went where."""
        inp.live[:] = False
        plan = BeatPlan(self.beat, [], {})
        for slot, s in self.slots.items():
            if ready is not None and slot not in ready:
                continue
            inp.live[slot] = True
            plan.slots.append(slot)
            if not s.started and len(s.jitter) >= self.prebuffer:
                s.started = True
            nums = []
            for f in range(FRAMES_PER_BEAT):
                nums.append(self._take(s, inp.audio[slot, f]))
            plan.frames[slot] = (nums[0], nums[1])
            plan.owners[slot] = s
            if s.started and s.low is not None:
                self._shed(s, len(s.jitter) - nums.count(SILENCE))
        inp.beat = self.beat
        self.beat += 1
        return plan

    def _take(self, s: Slot, dst: np.ndarray) -> int:
        if s.started and s.jitter:
            frame_no, pcm = s.jitter.popleft()
            dst[:] = pcm
            s.stats.frames_in += 1
            self.totals.frames_in += 1
            s.last_in = frame_no
            return frame_no
        dst[:] = 0.0
        if s.started:
            s.stats.underruns += 1
            self.totals.underruns += 1
        else:
            s.stats.idle_frames += 1
            self.totals.idle_frames += 1
        return SILENCE

    def _shed(self, s: Slot, spare: int) -> None:
        """Record this beat's spare; drop the oldest frames the window shows were never needed."""
        s.low.record(spare)
        lowest = s.low.lowest()
        if lowest is None or lowest <= self.shedding.keep:
            return
        n = min(lowest - self.shedding.keep, self.shedding.per_beat, len(s.jitter))
        for _ in range(n):
            s.jitter.popleft()
        s.low.shed_total += n
        s.stats.shed += n
        s.stats.dropped += n
        self.totals.shed += n
        self.totals.dropped += n

    def complete(self, plan: BeatPlan, late: bool) -> dict[int, tuple[object, int]]:
        """Account for a finished beat. Returns slot -> (key, first output frame index) for the
        slots still held by the same session (a slot released, or released and re-admitted,
        mid-beat gets nothing: its outputs belong to nobody alive)."""
        routed = {}
        for slot in plan.slots:
            s = self.slots.get(slot)
            if s is None or s is not plan.owners[slot]:
                continue
            if late:
                s.stats.late_beats += 1
            routed[slot] = (s.key, s.out_frame)
            s.out_frame += FRAMES_PER_BEAT
            s.stats.frames_out += FRAMES_PER_BEAT
            self.totals.frames_out += FRAMES_PER_BEAT
        return routed


def silence_frame() -> np.ndarray:
    return np.zeros(SAMPLES_IN, np.float32)
