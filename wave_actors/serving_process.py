"""Interpreter settings for the process that serves a node (the node CLI, a benchmark run).

- The cyclic collector: what exists when serving starts (the model, its state, its graphs) is
  frozen out of its reach, so an old-generation collection walks only what serving allocates. A
  walk over a loaded model is a pause of tens of ms, enough to make a beat late.
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
    """Within: the collector skips what exists now, and threads switch every 0.5 ms. Both are
    undone on exit (a benchmark run inside a test process)."""
    interval = sys.getswitchinterval()
    gc.freeze()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        gc.unfreeze()
