"""Timing on the GPU for the device benches: CUDA events around each call; and each variant
in a child process, so a hang or a broken CUDA context costs one row, not the run."""
from __future__ import annotations

import json
import statistics
import subprocess

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


def child_rows(cmd: list, timeout: int, variant: dict, env: dict | None = None) -> list:
    """The rows a child bench prints on its `RESULT <json>` line, or one row of `variant`
    with the error (its output's tail, or the timeout)."""
    try:
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [dict(variant, error=f"no result in {timeout} s (a hang?)")]
    got = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
    if got:
        return json.loads(got[-1][7:])
    return [dict(variant, error=(run.stderr or run.stdout)[-4000:])]
