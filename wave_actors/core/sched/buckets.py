"""The graph executor's ladder of batch buckets, torch-free (the simulator prices beats by it).

A GPU executor captures one beat graph per bucket up to its slot count at build
(gpu/engine/graph/beat_graphs.py); a beat of n live sessions replays the smallest captured bucket
that holds them, its other rows padding. `bucket_for` is that bucket when every bucket up to the
slots was captured (a device short of memory stops the ladder early: its smaller beats pad to
the smallest bucket it captured).
"""
from __future__ import annotations

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448,
           512)


def bucket_for(n: int, max_sessions: int) -> int:
    """The batch a beat of `n` live sessions replays on a node of `max_sessions` slots: the
    smallest bucket >= n, the slot count where that is larger (the top bucket is the slots)."""
    for b in BUCKETS:
        if b >= n:
            return min(b, max_sessions)
    return max_sessions
