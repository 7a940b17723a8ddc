"""`python -m sim.fleet`: many simulated GPU nodes behind the fleet's own directory and
placement code (`wave_actors/fleet/`), driven by the workload generators, beat by beat.

Each node is the cost model's node at its context: a beat at n live sessions takes
`beat_time(n)` plus, for the starts it carries, a snapshot copy each (and the copy's fixed
price once); the host's share is the model's median. A node offers the directory the slots it
can carry on time (at most `--slots`, fewer where the beat at that count would not leave the
start margin), and carries each beat only the queued starts that fit before the deadline less
the margin, oldest first, as the node's guarded start policy does; the rest wait a beat.
Calls arrive from the workload and are placed at once (the slot counted then); a call no node
can take is blocked. A started call holds its slot for its length, then closes.

Reported per placement policy: blocking, late beats (a beat past 160 ms with a live session),
open waits (beats a placed call waited for its start), imbalance (the spread of the nodes'
occupancy each minute), and what the directory costs: its calls a second at the peak and its
own CPU time a call, measured here.

    python -m sim.fleet --nodes 64 --workload diurnal:peak=213.3,duration=86400,trough=0.8
    python -m sim.fleet --nodes 4 --workload poisson:rate=12,duration=600 --placement random
"""
from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np

from sim.costmodel import CostModel
from wave_actors.bench.provenance import stamp
from wave_actors.bench.workload import GENERATORS, WorkloadError, lengths, parse_spec
from wave_actors.core.frames import BEAT_S
from wave_actors.fleet.directory import Directory, FleetFull
from wave_actors.fleet.placement import POLICIES

MARGIN_S = 0.008            # the node's start margin (GuardedStarts' default)
IMBALANCE_EVERY_S = 60.0


def node_slots(cost: CostModel, context: float, slots: int) -> int:
    """The most sessions a node carries with a beat that still leaves the margin."""
    host = float(np.median(cost.host_s)) if cost.host_s else 0.0
    n = slots
    while n > 1 and cost.beat_time(n, context, slots) + host + MARGIN_S > BEAT_S:
        n -= 1
    return n


def arrivals(spec: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    name, params = parse_spec(spec)
    if "hold" in params:
        params["call"] = params.pop("hold")
    rng = np.random.default_rng([seed, 0x5717])
    try:
        at = GENERATORS[name](rng, **params)
    except TypeError as exc:
        raise WorkloadError(f"{spec!r}: {exc}") from None
    return at, lengths(rng, len(at), params.get("call", 90.0))


class FleetRun:
    def __init__(self, nodes: int, slots: int, placement: str, cost: CostModel,
                 context: float, seed: int):
        self.directory = Directory(placement, seed)
        self.cost, self.context = cost, context
        self.host = float(np.median(cost.host_s)) if cost.host_s else 0.0
        cap = node_slots(cost, context, slots)
        self.names = [f"gpu{i}" for i in range(nodes)]
        for name in self.names:
            self.directory.join(name, f"tcp://{name}:5555", cap)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.live = np.zeros(nodes, dtype=np.int64)
        self.queues = [deque() for _ in range(nodes)]     # (session, placed at beat, length)
        self.waiting: set[int] = set()                    # nodes with a start queued
        n = np.arange(cap + 1)
        self.beat_s = np.array([cost.beat_time(int(k), context, slots) if k else 0.0 for k in n])
        self.copy_s, self.copy_beat_s = cost.copy_s, cost.copy_beat_s
        self.ends: list = []                 # (end beat, session)
        self.waits: list[int] = []
        self.late = self.beats_live = self.blocked = self.calls = 0
        self.directory_s = 0.0               # the directory's own time, placements and closes
        self.directory_calls = 0
        self.peak_calls_per_s = 0.0
        self.spread: list[float] = []
        self.series: list[list[float]] = []   # each minute: time s, live calls, blocked so far

    def _ask(self, fn, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.directory_s += time.perf_counter() - t
            self.directory_calls += 1

    def run(self, at: np.ndarray, length: np.ndarray) -> dict:
        beat_of = np.floor(at / BEAT_S).astype(np.int64)
        last = int(beat_of.max()) + 1 if len(at) else 0
        starts = np.searchsorted(beat_of, np.arange(last + 1))
        k, every = 0, max(1, int(IMBALANCE_EVERY_S / BEAT_S))
        window_calls, window_beats = 0, int(1.0 / BEAT_S) * 10
        while k < last or self.ends or self.waiting:
            asked = self._closes(k)
            if k < last:
                for i in range(starts[k], starts[k + 1]):
                    asked += 1
                    self._arrive(k, float(length[i]))
            window_calls += asked
            if k % window_beats == window_beats - 1:
                self.peak_calls_per_s = max(self.peak_calls_per_s,
                                            window_calls / (window_beats * BEAT_S))
                window_calls = 0
            self._beat(k)
            if k % every == 0:
                self.series.append([round(k * BEAT_S, 1), int(self.live.sum()), self.blocked])
                if self.live.sum():
                    occ = self.live / (self.beat_s.size - 1)
                    self.spread.append(float(occ.max() - occ.min()))
            k += 1
        return self._result(k)

    def _closes(self, k: int) -> int:
        n = 0
        while self.ends and self.ends[0][0] <= k:
            _, session, node = heapq.heappop(self.ends)
            self._ask(self.directory.closed, session)
            self.live[node] -= 1
            n += 1
        return n

    def _arrive(self, k: int, length_s: float) -> None:
        self.calls += 1
        try:
            placed = self._ask(self.directory.place, None)
        except FleetFull:
            self.blocked += 1
            return
        node = self.index[placed.node]
        self.queues[node].append((placed.session, k, length_s))
        self.waiting.add(node)

    def _beat(self, k: int) -> None:
        """Each node with queued starts carries those that fit, oldest first; then every node
        with a session live or starting runs its beat (at its live count before the starts,
        plus their copies), and is late past 160 ms."""
        carried = np.zeros(len(self.queues), dtype=np.int64)
        for i in sorted(self.waiting):
            queue = self.queues[i]
            room = BEAT_S - MARGIN_S - self.host - self.beat_s[self.live[i]] - self.copy_beat_s
            fits = int(room // self.copy_s) if room > 0 else 0
            n = carried[i] = min(len(queue), max(fits, 1 if self.live[i] == 0 else 0))
            for _ in range(n):
                session, placed_at, length_s = queue.popleft()
                self.waits.append(k - placed_at)
                heapq.heappush(self.ends, (k + 1 + int(length_s / BEAT_S), session, i))
            if not queue:
                self.waiting.discard(i)
        ran = (self.live > 0) | (carried > 0)
        took = (self.beat_s[self.live] + carried * self.copy_s
                + np.where(carried > 0, self.copy_beat_s, 0.0) + self.host)
        self.beats_live += int(ran.sum())
        self.late += int((took[ran] > BEAT_S).sum())
        self.live += carried

    def _result(self, beats: int) -> dict:
        waits = np.array(self.waits or [0]) * BEAT_S
        d = self.directory
        return {"placement": d.placement.name, "nodes": len(self.names),
                "slots_per_node": self.beat_s.size - 1, "calls": self.calls,
                "blocked": self.blocked, "blocking": self.blocked / max(1, self.calls),
                "late_beats": int(self.late), "node_beats": int(self.beats_live), "beats": beats,
                "open_wait_s": {"p50": float(np.percentile(waits, 50)),
                                "p99": float(np.percentile(waits, 99)),
                                "max": float(waits.max())},
                "imbalance": {"p50": float(np.median(self.spread)) if self.spread else 0.0,
                              "max": max(self.spread, default=0.0)},
                "directory": {"calls": self.directory_calls,
                              "us_per_call": 1e6 * self.directory_s / max(1,
                                                                          self.directory_calls),
                              "peak_calls_per_s": self.peak_calls_per_s},
                "refusals": dict(d.counters.refusals), "series": self.series}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sim.fleet",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--slots", type=int, default=300, help="each node's slots")
    ap.add_argument("--profile", choices=("reference", "dense"), default="dense")
    ap.add_argument("--cost-model", default="sim/costmodel_h200_dense.json")
    ap.add_argument("--context", type=float, default=1500)
    ap.add_argument("--workload", required=True, help="a generator spec, e.g. poisson:rate=12,"
                                                      "duration=600 (rates are the fleet's)")
    ap.add_argument("--placement", nargs="+", default=sorted(POLICIES),
                    choices=sorted(POLICIES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="write the results JSON here")
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.nodes < 1 or args.slots < 1:
        _parser().error("--nodes and --slots are >= 1")
    cost = CostModel.load(args.cost_model, args.profile)
    try:
        at, length = arrivals(args.workload, args.seed)
    except WorkloadError as exc:
        _parser().error(str(exc))
    runs = []
    for name in args.placement:
        t0 = time.perf_counter()
        run = FleetRun(args.nodes, args.slots, name, cost, args.context, args.seed)
        result = run.run(at, length)
        result["wall_s"] = round(time.perf_counter() - t0, 1)
        runs.append(result)
        print(f"{name:12s} calls {result['calls']:9d}  blocking {100 * result['blocking']:6.3f} %"
              f"  late {result['late_beats']:5d}  open p99 {result['open_wait_s']['p99']:.2f} s"
              f"  imbalance p50 {result['imbalance']['p50']:.3f}"
              f"  directory {result['directory']['us_per_call']:.1f} us/call,"
              f" {result['directory']['peak_calls_per_s']:.0f}/s at peak"
              f"  ({result['wall_s']} s)", flush=True)
    doc = {"command": "python -m sim.fleet " + " ".join(sys.argv[1:] if argv is None else argv),
           **stamp(), "workload": args.workload, "seed": args.seed, "profile": args.profile,
           "cost_model": args.cost_model, "context": args.context, "runs": runs}
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc))
        plot(doc, out.with_suffix(".png"))
        print(f"written: {out} and {out.with_suffix('.png')}")
    return 0


def plot(doc: dict, path: Path) -> None:
    """Live calls and blocking over the run, a line per placement (the same calls each)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for r in doc["runs"]:
        t, live, blocked = (np.array(c) for c in zip(*r["series"])) if r["series"] else ([],) * 3
        slots = r["nodes"] * r["slots_per_node"]
        top.plot(np.asarray(t) / 3600, 100 * np.asarray(live) / slots, label=r["placement"])
        bottom.plot(np.asarray(t) / 3600, blocked, label=r["placement"])
    top.set_ylabel("occupancy %")
    bottom.set_ylabel("calls blocked (total)")
    bottom.set_xlabel("hours")
    top.set_title(f"{doc['runs'][0]['nodes']} nodes: {doc['workload']}")
    top.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
