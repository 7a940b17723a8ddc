"""Timing on the GPU for the device benches: CUDA events around each call."""
from __future__ import annotations

import statistics

import torch


def median_ms(fn, reps: int, warmup: int = 1) -> float:
    """The median ms of `reps` calls of `fn` after `warmup` untimed ones (the first compiles
    and loads what it launches)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)
