"""How a set of durations spreads: p50, p99 and max in milliseconds, for the results the bench
writes and the executors describe."""
from __future__ import annotations

from typing import Iterable

import numpy as np


def spread_ms(seconds: Iterable[float]) -> dict:
    """{"p50", "p99", "max"} of `seconds` in ms, rounded to 0.01 (linear between ranks; all 0
    when there are none)."""
    xs = np.asarray(list(seconds), float) * 1000
    if xs.size == 0:
        xs = np.zeros(1)
    return {k: round(float(v), 2)
            for k, v in zip(("p50", "p99", "max"), np.percentile(xs, [50, 99, 100]))}
