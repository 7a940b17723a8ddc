"""Where a queued frame's samples lie: a `FrameStore` of places the jitter buffers take and
give back, or `RingPlaces` in the shared ring the session workers write (fixed by slot and
frame number, stamped); `FramesToRead` is a beat's frames left in the ring for an executor that
reads them itself. The jitter buffers on arrays (`jitter_arrays.py`) keep only the places.
"""
from __future__ import annotations

import numpy as np

from wave_actors.core.frames import FRAMES_PER_BEAT, SAMPLES_IN, SILENCE


class FrameStore:
    """Frames' samples in one growing array; `take` hands out free places (the last freed
    first, still in cache), `give` takes them back. Place `SILENT` is never handed out and
    always holds zeros: a beat's silences are gathered from it like frames, so a beat is
    packed with one gather."""
    SILENT = 0

    def __init__(self, places: int, limit: int):
        self.limit = limit + 1                        # never more places than this in use
        self.pcm = np.zeros((places + 1, SAMPLES_IN), np.float32)
        self._free = np.arange(places, 0, -1, dtype=np.int64)   # a stack: top at the end
        self._top = places

    @property
    def in_use(self) -> int:
        """Places holding a queued frame."""
        return len(self.pcm) - 1 - self._top

    def take(self, k: int) -> np.ndarray:
        if k > self._top:
            self._grow(k - self._top)
        self._top -= k
        return self._free[self._top:self._top + k].copy()

    def give(self, places: np.ndarray) -> None:
        k = len(places)
        self._free[self._top:self._top + k] = places
        self._top += k

    def _grow(self, short: int) -> None:
        old = len(self.pcm)
        new = min(self.limit, max(2 * old, old + short))
        assert new - old >= short, "more frames queued than the buffers hold"
        pcm = np.empty((new, SAMPLES_IN), np.float32)
        pcm[:old] = self.pcm
        free = np.empty(new - 1, np.int64)              # every place but the silent one
        free[:new - old] = np.arange(new - 1, old - 1, -1)    # the new places at the bottom
        free[new - old:new - old + self._top] = self._free[:self._top]
        self.pcm, self._free, self._top = pcm, free, self._top + new - old


class RingPlaces:
    """Places in a ring of frames fixed by slot and frame number (a `shared_frames.FrameRing`),
    stamped with the generation and number of the frame each holds. Nothing is taken or given
    back; `generations` is each slot's current one (the session table's)."""

    def __init__(self, ring, generations: np.ndarray):
        self.ring, self.pcm, self.generations = ring, ring.pcm, generations

    def give(self, places: np.ndarray) -> None:
        pass


class FramesToRead:
    """A beat's frames left in the shared ring for an executor that reads them itself
    (`Capabilities.reads_frames`): each slot's two places (the silent one where it has no
    frame) and the generation and number each place must still hold. `rows` checks the stamps
    after reading, as the clock's own gather does: a place written again meanwhile is heard as
    silence and recorded in `torn` for the clock to count once the beat is collected. Read on
    the executor's thread; `torn` is read by the clock after `collect`."""

    def __init__(self, ring: RingPlaces, places: np.ndarray, generations: np.ndarray,
                 nums: np.ndarray):
        self.ring, self.places = ring.ring, places
        self.generations, self.nums = generations, nums        # [S], [S, 2]: per slot
        self.torn: list[tuple[np.ndarray, np.ndarray]] = []    # (slots, frame indexes)

    @classmethod
    def packed(cls, ring: RingPlaces, slots: np.ndarray, nums: np.ndarray, span: np.ndarray,
               lo: int) -> "FramesToRead":
        """What a pack chose: `nums` [k, 2] of the packed `slots`, `span` the places of slots
        lo, lo + 1, ... (silent where not packed). Every other slot reads silence. The
        generations are taken as packed: a slot released and taken again mid-beat is another's."""
        n = len(ring.generations)
        places = np.full((n, FRAMES_PER_BEAT), FrameStore.SILENT, np.int64)
        places[lo:lo + len(span)] = span
        every = np.full((n, FRAMES_PER_BEAT), SILENCE, np.int64)
        every[slots] = nums
        return cls(ring, places, ring.generations.copy(), every)

    def rows(self, slots: np.ndarray) -> np.ndarray:
        places = self.places[slots]
        rows = np.take(self.ring.pcm, places, axis=0)
        nums = self.nums[slots]
        framed = nums != SILENCE
        ok = ~framed | self.ring.holds(places, self.generations[slots][:, None], nums)
        if not ok.all():
            r, f = np.nonzero(~ok)
            rows[r, f] = 0.0
            self.torn.append((slots[r], f))
        return rows
