"""How long Python's cyclic garbage collector stopped the serving loop, beat by beat.

`serving_process()` freezes what exists when serving starts (a full walk over a loaded model is
tens of ms) and young objects are collected cheaply, but a collection still stops every thread
while it runs. `GcPauses` times each one through `gc.callbacks`, so every beat record says how
much of the time since the previous beat went to it (`BeatRecord.gc_s`, the bench's `gc_ms`):
a late beat with a long pause before it is the collector's, one without is not.
"""
from __future__ import annotations

import gc
import time


class GcPauses:
    """Accumulates the time spent inside garbage collections (all generations) since the last
    `take()`, and the longest full collection seen."""

    def __init__(self):
        self._start = 0.0
        self._pending = 0.0
        self.collections = 0
        self.full_collections = 0
        self.longest_full_s = 0.0

    def install(self) -> "GcPauses":
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        return self

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def take(self) -> float:
        """Seconds of collection since the previous call."""
        spent, self._pending = self._pending, 0.0
        return spent

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        spent = time.perf_counter() - self._start
        self._pending += spent
        self.collections += 1
        if info.get("generation") == 2:
            self.full_collections += 1
            self.longest_full_s = max(self.longest_full_s, spent)


YOUNG_EVERY, FULL_EVERY = 10, 1000     # beats: the middle, and the oldest, generation's turn


def collect_between_beats(beat: int) -> int | None:
    """Where automatic collection is off (`serving_process`), the beat clock calls this after
    each beat's outputs are routed, when the next release is still ahead: the youngest
    generation every beat, the middle one every YOUNG_EVERY beats and a full pass every
    FULL_EVERY (about the interpreter's own cadence for a loop that allocates a few hundred
    objects a beat). Returns the generation collected, None where the collector runs itself."""
    if gc.isenabled():
        return None
    generation = 2 if beat % FULL_EVERY == FULL_EVERY - 1 else 1 if beat % YOUNG_EVERY == YOUNG_EVERY - 1 else 0
    gc.collect(generation)
    return generation
