"""The beat scheduler: slots, per-slot jitter buffers, packing a beat and accounting for it.

Pure and synchronous (no asyncio, no torch, no sockets) so the clock, the simulator and the
property tests run this exact code. Per live slot and beat:

  - frames arrive numbered 0, 1, 2 … from the slot's SessionActor and queue in a bounded jitter
    buffer (overflow drops the oldest frame, counted as `dropped`);
  - a slot starts consuming once `prebuffer` frames are queued (absorbs client jitter); before
    that it is `idle` and the model hears silence (counted as idle frames, not underruns);
  - once started, each beat takes two frames; a missing one becomes silence + `underruns`.

Invariant (checked by the property tests): for every slot, the frame numbers handed to the backend
are strictly increasing, and every pushed frame is either handed over exactly once or counted in
`dropped` (or still queued when the slot is released, counted then as `dropped`).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np

from wave_actors.core.contract import BeatInput
from wave_actors.core.frames import FRAMES_PER_BEAT, SAMPLES_IN

SILENCE = -1        # frame number recorded for a silence frame


class CapacityError(Exception):
    pass


@dataclass
class SlotStats:
    frames_in: int = 0          # frames handed to the backend
    frames_out: int = 0         # output frames routed back
    underruns: int = 0          # silence substituted for a missing frame after the stream started
    idle_frames: int = 0        # silence while prebuffering (before the first frame arrived)
    dropped: int = 0            # frames pushed but never handed over (overflow or close)
    late_beats: int = 0         # beats this slot took part in that finished after the deadline

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Slot:
    key: object
    jitter: collections.deque = field(default_factory=collections.deque)
    started: bool = False
    out_frame: int = 0          # model frame index of the next output frame
    last_in: int = -1           # frame number of the last frame handed over
    stats: SlotStats = field(default_factory=SlotStats)


@dataclass
class BeatPlan:
    beat: int
    slots: list[int]                        # live slots packed into this beat
    frames: dict[int, tuple[int, int]]      # slot -> the two frame numbers (SILENCE for silence)
    owners: dict[int, "Slot"] = field(default_factory=dict)   # who held the slot when packed


class BeatScheduler:
    def __init__(self, max_sessions: int, prebuffer: int = 3, max_queue: int = 50):
        assert prebuffer >= 1 and max_queue >= prebuffer + FRAMES_PER_BEAT
        self.max_sessions = max_sessions
        self.prebuffer, self.max_queue = prebuffer, max_queue
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
        self.slots[slot] = Slot(key)
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
