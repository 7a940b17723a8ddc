"""Interpreter settings for the process that serves a node (the node CLI, a benchmark run).

- The cyclic collector: what exists when serving starts (the model, its state, its graphs) is
  frozen out of its reach, so an old-generation collection walks only what serving allocates. A
  walk over a loaded model is a pause of tens of ms, enough to make a beat late.
- Automatic collection is off: the allocations of a beat's routing (a few hundred objects for
  120 sessions) cross the young generation's threshold inside the route nearly every beat, so
  a collection would land in almost every beat's latency. The beat clock collects instead,
  between beats (`gc_pauses.collect_between_beats`), when no beat waits.
- The GIL switch interval: a GPU backend's worker thread waits for the device with the GIL
  released and must take it back to hand the beat's outputs over. While the event loop thread
  runs Python (reading the callers' frames, routing outputs) that takes up to one switch
  interval per hand-back, 5 ms by default, several times a beat. 0.5 ms bounds it.
"""
from __future__ import annotations

import contextlib
import gc
import sys
from typing import Iterator

SWITCH_INTERVAL_S = 0.0005


@contextlib.contextmanager
def serving_process() -> Iterator[None]:
    """Within: the collector skips what exists now and runs only when the beat clock asks,
    and threads switch every 0.5 ms. All undone on exit (a benchmark run inside a test
    process)."""
    interval, automatic = sys.getswitchinterval(), gc.isenabled()
    gc.freeze()
    gc.disable()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        if automatic:
            gc.enable()
        gc.unfreeze()
