"""`python -m sim.latency`: input latency through the real node on virtual time, as a network
would shape it: one client streams 80 ms frames (with up to 10 ms of jitter), through a stall
whose backlog then arrives at once, or under random message loss. The sim executor's trace says
which beat heard each frame; its latency is that beat's release minus the frame's send.

    python -m sim.latency                       # stall and 10 % loss, adaptive vs fixed buffer
    python -m sim.latency --out bench/results   # also writes latency-virtual.json

Targets (docs/PROTOCOL.md, issue 15): after a 1.2 s stall, latency back within 40 ms of its
baseline within 5 s; under 10 % loss, within 100 ms of baseline.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from sim.costmodel import CostModel
from sim.executor import SimExecutor
from transports.client import NodeClient
from wave_actors.core.sched.clock_policy import ClockPolicy
from wave_actors.core.contract import ExecutorOptions
from wave_actors.core.frames import FRAME_MS, SAMPLES_IN
from wave_actors.bench.results import git_commit
from wave_actors.core.timebase import Clock, VirtualTimeLoop
from wave_actors.node.config import NodeConfig
from wave_actors.node.node import Node

FRAME_S = FRAME_MS / 1000.0
CODE = float(2 ** 20)              # frame k is coded as the constant k / 2^20: exact in float32


@dataclass(frozen=True, kw_only=True)
class Scenario:
    seconds: float = 24.0
    stall: tuple[float, float] | None = None     # nothing arrives in [a, b); then all at once
    loss: float = 0.0
    jitter_s: float = 0.010
    seed: int = 0


STALL = Scenario(stall=(8.0, 9.2))


def call(policy: ClockPolicy, sc: Scenario) -> list[tuple[float, float]]:
    """(send time from the call's start, latency) of every frame the model heard."""
    loop = VirtualTimeLoop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(_call(policy, sc, Clock(loop)))
    finally:
        loop.close()
        asyncio.set_event_loop(None)


async def _call(policy: ClockPolicy, sc: Scenario, clock: Clock) -> list[tuple[float, float]]:
    executor = SimExecutor(ExecutorOptions(max_sessions=1), CostModel.load(), clock, trace=True)
    node = Node(NodeConfig(bind=f"inproc://latency-{id(clock)}", max_sessions=1,
                           clock_policy=policy), executor, clock)
    await node.start()
    client = NodeClient(node.cfg.bind, ctx=node.ctx)
    client.connect()
    try:
        s = await client.open("call", sample_rate=16000, format="pcm_f32le")
        t0, rng = clock.now(), random.Random(sc.seed)
        arrivals = []
        for k in range(int(sc.seconds / FRAME_S)):
            at = k * FRAME_S + rng.uniform(0.0, sc.jitter_s)
            if sc.stall and sc.stall[0] <= k * FRAME_S < sc.stall[1]:
                at = sc.stall[1]
            if rng.random() >= sc.loss:
                arrivals.append((at, k))
        for at, k in sorted(arrivals):
            await clock.sleep(max(0.0, t0 + at - clock.now()))
            await s.send_audio(np.full(SAMPLES_IN, k / CODE, np.float32).tobytes(), seq=k)
        await clock.sleep(1.0)
        release = {r.beat: r.release for r in node.clock_actor.stats.records}
        heard = []
        for beat, _slot, first, _last in executor.trace:
            if first != 0.0 and beat in release:
                k = int(round(first * CODE))
                heard.append((k * FRAME_S, release[beat] - t0 - k * FRAME_S))
        return heard
    finally:
        await client.aclose()
        await node.drain(timeout=2.0)
        node.ctx.destroy(linger=0)


def mean_latency(rows: list[tuple[float, float]], lo: float, hi: float) -> float:
    return statistics.fmean(lat for t, lat in rows if lo <= t < hi)


def measure(policy: ClockPolicy, seeds=(1, 2)) -> dict:
    """Baseline, after the stall (from 5 s past it) and under 10 % loss, in ms."""
    stall = call(policy, STALL)
    a, b = STALL.stall
    base = mean_latency(stall, 2.0, a)
    after = mean_latency(stall, b + 5.0, STALL.seconds - 1)
    clean = [mean_latency(call(policy, Scenario(seed=s)), 2.0, 23.0) for s in seeds]
    lossy = [mean_latency(call(policy, Scenario(loss=0.10, seed=s)), 2.0, 23.0) for s in seeds]
    ms = lambda x: round(1000 * x, 1)
    return {"baseline_ms": ms(base), "after_stall_ms": ms(after),
            "stall_excess_ms": ms(after - base),
            "loss10_excess_ms": ms(max(lo - cl for lo, cl in zip(lossy, clean))),
            "policy": policy.describe()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.latency", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", help="directory for latency-virtual.json")
    args = ap.parse_args(argv)
    rows = {"adaptive": measure(ClockPolicy()),
            "fixed": measure(ClockPolicy(jitter_shed_per_beat=0))}
    print(f"{'buffer':9} {'baseline':>9} {'5 s after stall':>16} {'excess':>7} {'10% loss excess':>16}")
    for name, r in rows.items():
        print(f"{name:9} {r['baseline_ms']:>7.1f}ms {r['after_stall_ms']:>14.1f}ms "
              f"{r['stall_excess_ms']:>5.1f}ms {r['loss10_excess_ms']:>14.1f}ms")
    ok = rows["adaptive"]["stall_excess_ms"] <= 40 and rows["adaptive"]["loss10_excess_ms"] <= 100
    if args.out:
        out = Path(args.out) / "latency-virtual.json"
        date = datetime.now(timezone.utc).isoformat(timespec="seconds")
        out.write_text(json.dumps({"latency": rows, "targets_met": ok, "date": date,
                                   "command": "python -m sim.latency " + " ".join(argv or sys.argv[1:]),
                                   "commit": git_commit()}, indent=1) + "\n")
        print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
