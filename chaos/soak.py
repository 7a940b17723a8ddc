"""What a soak adds to a chaos run (`python -m chaos.run --soak MINUTES`): a plan that long, and
the processes' memory and open files sampled through it.

A node and its bridges serving for hours must not grow: a leak shows as resident memory or file
descriptors that keep rising after the first minutes (caches and pools warm up in those; they
are left out of the growth). Read from /proc, so Linux only; elsewhere nothing is sampled and
the figures say so.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

WARMUP_S = 60.0              # growth counts from the first sample after this
RSS_GROWTH_MB = 20.0         # the soak fails past this growth of any process's resident memory


def soak_plan(plan_type, minutes: float):
    """A soak of `minutes`: the long plan's fuzzers and relay, more victims, one of them a
    reader that pauses, memory and files sampled every 10 s."""
    if minutes <= 0:
        raise ValueError("--soak needs a positive number of minutes")
    return plan_type("soak", 60.0 * minutes, 6, 2, 4000, 800, 60, 15.0, 30.0,
                     slow_readers=1, sample_s=10.0)


def rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


@dataclass
class Resources:
    """Each process's (seconds into the run, RSS kB, open fds), sampled."""
    series: dict[str, list[tuple[float, int, int]]] = field(default_factory=dict)

    def sample(self, at_s: float, pids: dict[str, int]) -> None:
        for name, pid in pids.items():
            rss, fds = rss_kb(pid), open_fds(pid)
            if rss is not None and fds is not None:
                self.series.setdefault(name, []).append((round(at_s, 1), rss, fds))

    def growth(self) -> dict[str, dict]:
        """Per process: RSS and fds at the first sample past the warm-up and at the last, and
        the growth between them."""
        out = {}
        for name, rows in self.series.items():
            after = [r for r in rows if r[0] >= WARMUP_S] or rows[-1:]
            first, last = after[0], rows[-1]
            out[name] = {"from_s": first[0], "to_s": last[0],
                         "rss_mb": [round(first[1] / 1024, 1), round(last[1] / 1024, 1)],
                         "rss_growth_mb": round((last[1] - first[1]) / 1024, 1),
                         "fds": [first[2], last[2]], "fds_growth": last[2] - first[2]}
        return out

    def worst_rss_growth_mb(self) -> float | None:
        g = self.growth()
        return max((v["rss_growth_mb"] for v in g.values()), default=None)
