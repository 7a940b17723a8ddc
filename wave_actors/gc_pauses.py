"""Python's cyclic garbage collector, kept off the beat's critical path.

A full (generation 2) collection walks every tracked object. After start-up, with torch, Triton
and the model imported, that is ~180 k objects and 180-200 ms on our 2-core CPU machine: an
automatic one landing on the event loop delays every beat it overlaps (late-beat clusters with
40-90 ms of release-to-backend delay on the H200). `freeze_startup()` collects once and moves
every object alive at start into the permanent generation, which later collections skip; young
objects (a beat's lists and dicts) are still collected, cheaply. `GcPauses` times every
collection through `gc.callbacks` so each beat record says how long the loop was stopped by one.
"""
from __future__ import annotations

import gc
import time


_frozen = False


def freeze_startup() -> int:
    """Once per process (the first node's start): collect, then freeze everything alive now (the
    model, modules, kernels): later collections never walk it. A later node in the same process
    (the bench's next run, a test) leaves it as it is, so its garbage stays collectable. Returns
    the number of frozen objects."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.collect()
        gc.freeze()
    return gc.get_freeze_count()


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
