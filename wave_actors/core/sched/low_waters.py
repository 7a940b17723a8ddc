"""`jitter.LowWater` for every slot of `ArrayScheduler` at once: each started slot's spares over
its last `window` beats and the lowest of them, as array operations over the slots of a beat.

As in `LowWater`, a spare is stored plus the frames shed before it (`shed_total`): shedding n
frames lowers every past spare by n, which the lookup subtracts instead of rewriting the window.
"""
from __future__ import annotations

import numpy as np

from wave_actors.core.sched.jitter import Shedding


class LowWaters:
    def __init__(self, slots: int, shedding: Shedding):
        self.shedding = shedding
        self.window = np.zeros((slots, shedding.window_beats), np.int64)
        self.beats = np.zeros(slots, np.int64)          # beats recorded since the slot started
        self.shed_total = np.zeros(slots, np.int64)

    def clear(self, slot: int) -> None:
        """A new session in the slot: nothing recorded."""
        self.beats[slot] = self.shed_total[slot] = 0

    def lowest(self, slot: int) -> int | None:
        """The slot's lowest spare over its window; None until a whole window has been seen."""
        if self.beats[slot] < self.window.shape[1]:
            return None
        return int(self.window[slot].min() - self.shed_total[slot])

    def record(self, slots: np.ndarray, spare: np.ndarray, queued: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """Record this beat's spare of each slot (`queued`: the frames it holds). Returns the
        slots whose window is whole and how many of their oldest frames to shed: what the
        lowest spare shows was never needed beyond `keep`, at most `per_beat` and `queued`.
        The caller sheds exactly those."""
        w = self.window.shape[1]
        beats = self.beats[slots]
        self.window[slots, beats % w] = spare + self.shed_total[slots]
        self.beats[slots] = beats + 1
        whole = beats + 1 >= w
        slots, queued = slots[whole], queued[whole]
        keep, most = self.shedding.keep, self.shedding.per_beat
        lowest = self.window[slots].min(axis=1) - self.shed_total[slots]
        n = np.where(lowest > keep, np.minimum(np.minimum(lowest - keep, most), queued), 0)
        self.shed_total[slots] += n
        return slots, n
