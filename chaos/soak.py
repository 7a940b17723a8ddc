"""What a soak adds to a chaos run (`python -m chaos.run --soak MINUTES`): a plan that long, the
node held at capacity by calls that come and go, and the processes' memory and open files
sampled through it.

A node and its bridges serving for hours must not grow: a leak shows as resident memory or file
descriptors that keep rising after the first minutes (caches and pools warm up in those; they
are left out of the growth). Read from /proc, so Linux only; elsewhere nothing is sampled and
the figures say so.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from wave_actors.bench.clients import Generators

WARMUP_S = 60.0              # growth counts from the first sample after this
RSS_GROWTH_MB = 20.0         # the soak fails past this growth of any process's resident memory
NODE_SLOTS = 48              # the chaos node's --max-sessions
# Lines of calls that come and go beside the victims: the node's slots less the victims' and two
# the fuzzers' opens may take (a full node refuses them, and its refusals are fuzzed anyway).
# Each call lives an exponential time of CHURN_MEAN_S; a refused one dials again a second later.
CHURN_LINES = NODE_SLOTS - 6 - 2
CHURN_MEAN_S = 20.0


def soak_plan(plan_type, minutes: float):
    """A soak of `minutes`: the long plan's fuzzers and relay, more victims, one of them a
    reader that pauses, memory and files sampled every 10 s. No fuzzer takes a victim's
    identity unless asked (`--steal`): the memory a soak measures is then the node's own, not
    what libzmq keeps of each duplicate-identity connection (docs/PROTOCOL.md)."""
    if minutes <= 0:
        raise ValueError("--soak needs a positive number of minutes")
    return plan_type("soak", 60.0 * minutes, 6, 2, 4000, 800, 60, 15.0, 30.0,
                     slow_readers=1, sample_s=10.0, churn_lines=CHURN_LINES,
                     churn_mean_s=CHURN_MEAN_S, steal=False)


class Churn:
    """`lines` caller lines in a load-generator process (the bench's callers: real-time audio,
    `closed` awaited at each hang-up), each a call after another of mean `mean_s`."""

    def __init__(self, endpoint: str, lines: int, seed: int, mean_s: float = CHURN_MEAN_S):
        self.lines = lines
        self.gen = Generators(endpoint, lines, 1, mean_s, first=10_000, seed=seed)

    async def finish(self) -> dict:
        """The calls' figures; `failed`: why the callers could not report (a session whose
        `closed` never came fails its generator)."""
        try:
            stats, refused, calls = await self.gen.finish()
        except RuntimeError as exc:
            return {"lines": self.lines, "failed": str(exc)}
        finally:
            self.gen.kill()
        opened = [c for c in calls if c.opened_s is not None]
        return {"lines": self.lines, "calls": len(calls), "opened": len(opened),
                "refused": refused, "closed": len(stats),
                "frames_in": sum(s.get("frames_in", 0) for s in stats),
                "underruns": sum(s.get("underruns", 0) for s in stats),
                "dropped": sum(s.get("dropped", 0) for s in stats)}


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
