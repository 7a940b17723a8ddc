"""The capacity bench's runs: a node with its executor (`backend.py`), N callers driven
through its real sockets (`measure`), the largest N with no late beat (`find_max`). The command
line is `cli.py` (`python -m wave_actors.bench`); what a run records, `results.py`.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os

import numpy as np

from wave_actors.bench.results import WARMUP_BEATS, WINDOW_OF, RunResult
from wave_actors.bench import deadlines as deadline_metrics
from wave_actors.bench.workload import load as load_workload
from transports.client import NodeClient
from wave_actors.bench.clients import OPEN_TIMEOUT_S, Generators, drive_all, drive_workload
from wave_actors.core.frames import BEAT_S
from wave_actors.core.timebase import Clock, new_loop
from wave_actors.core.sched.spread import spread_ms
from wave_actors.runtime.metrics import OPEN_PHASES
from wave_actors.bench.records import (_host, _outside, _ramp, _trace, _windows,
                                       _workload_window, shifted)
from wave_actors.bench.backend import make_executor_for
from wave_actors.bench.report import print_run
from wave_actors.node.config import NodeConfig
from wave_actors.node.node import Node
from wave_actors.engine.serving_process import serving_process

CLIENT_PROCS = max(1, min(4, (os.cpu_count() or 2) // 4))   # callers' processes, real time


async def run_once(args, n: int, loop_virtual: bool, backend=None) -> RunResult:
    clock = Clock()
    own = backend is None
    if own:
        backend = make_executor_for(args, n + args.burst, clock)
    elif hasattr(backend, "clock"):
        backend.clock = clock
    # Virtual time needs every message to be readable the moment it is sent, which inproc ZMQ
    # gives and TCP (through ZMQ's I/O thread) does not: the loop would skip ahead of it.
    bind = f"inproc://bench-{id(clock)}" if loop_virtual else "tcp://127.0.0.1:0"
    cpu: dict = {}                   # the node's processes' CPU over the measured beats
    node = Node(NodeConfig(bind=bind, max_sessions=backend.max_sessions, idle_timeout_s=60.0,
                           start_timeout_s=OPEN_TIMEOUT_S, start_policy=args.start_policy,
                           clock_policy=args.clock_policy,
                           workers=0 if loop_virtual else args.workers,
                           **({"warm_prompts": ()} if args.no_warm else {})),
                backend, clock)
    await node.start()
    try:
        calls: list = []
        with serving_process():      # as `python -m wave_actors.node` serves
            if args.workload_obj is not None:
                everything, stats, calls, t0 = await _drive_workload(args, node, clock)
                records = _workload_window(everything, t0, args.workload_obj.window_s)
                refusals, burst = sum(len(c.refused) for c in calls), {}
            else:
                t0 = clock.now()     # the run's start: its callers dial from here
                records, stats, refusals, calls, burst = await _drive(args, node, n, clock,
                                                                      loop_virtual, cpu)
                # every beat with a live session: the callers have all closed by now
                everything = _live_records(node)
                calls = [shifted(c, t0) for c in calls]
            waits = [c.wait_s for c in calls if not c.blocked]
        errors = sum(node.counters.errors.values())
        if errors:
            print(f"           errors the node answered, by code: {node.counters.errors}",
                  flush=True)
        refused_by = dict(node.counters.refusals)
        stalls = (node.clock_actor.stalls.since(records[0].release - 1e-6) if records else [])
        first = records[0].beat if records else None
        ramp = _ramp([r for r in node.clock_actor.stats.records
                      if first is None or r.beat < first])
        policies = {"start": node.start_policy.describe(),
                    "clock": node.cfg.clock_policy.describe()}
        ran = node.clock_actor         # the drain below stops it (and drops it from the node)
        phases = list(node.metrics.recent_opens)
        snapshots = {**(ran.snapshot_stats or {}),
                     "warm": node.describe().get("warm_prompts", {})}
    finally:
        await node.drain()
        if own:
            backend.close()
    # what the start policy learned, as the clock that ran it left it: a worker engine's clock
    # sends its copy back when it stops (the front's is the one it was given)
    policies["start"] = getattr(ran, "start_policy", node.start_policy).describe()
    result = _result(args, n, _Raw(t0, everything, records, stats, refusals, calls, burst, waits,
                                   errors, refused_by, stalls, ramp, policies, cpu))
    result.snapshots = snapshots
    result.open_phases = {name: spread_ms(p[k] for p in phases)
                          for k, name in enumerate(OPEN_PHASES)} if phases else {}
    return result


@dataclasses.dataclass
class _Raw:
    """What a run left, before it is summed up."""
    t0: float
    everything: list
    records: list
    stats: list
    refusals: int
    calls: list
    burst: dict
    waits: list
    errors: int
    refused_by: dict
    stalls: list
    ramp: dict
    policies: dict
    cpu: dict


def _result(args, n: int, raw: _Raw) -> RunResult:
    """The run's figures from what it left: windows, latencies, opens, host, deadlines."""
    t0, everything, records, stats, calls, waits = (raw.t0, raw.everything, raw.records,
                                                    raw.stats, raw.calls, raw.waits)
    windows = _windows(everything, records, t0)
    whole = windows["all"]
    gpu = np.array([r.compute_s for r in records] or [0.0]) * 1000
    opens = np.array(waits) * 1000
    open_p50, open_p99, open_max = (np.percentile(opens, [50, 99, 100]) if waits
                                    else (0.0, 0.0, 0.0))
    live = np.array([r.sessions for r in records]) if records else np.zeros(1)
    live_seen = {"offered": n + args.burst, "min": int(live.min()), "p50": float(np.percentile(live, 50)),
                 "max": int(live.max())}
    result = RunResult(n, whole["beats"], whole["late_beats"], whole.get("p50_ms", 0.0),
                       whole.get("p99_ms", 0.0), whole.get("max_ms", 0.0), float(np.mean(gpu)),
                       sum(s["underruns"] for s in stats), sum(s["dropped"] for s in stats),
                       raw.refusals, sum(s["frames_in"] for s in stats),
                       sum(s["frames_out"] for s in stats), raw.errors,
                       float(np.percentile(gpu, 50)), float(np.percentile(gpu, 99)),
                       _trace(records), round(1000 * records[0].wake_s, 1) if records else 0.0,
                       len(waits), float(open_p50), float(open_p99), raw.policies,
                       float(open_max), dict(raw.refused_by), live_seen,
                       _host(records, raw.stalls, raw.cpu),
                       raw.burst, raw.ramp,
                       spread_ms(r.first_s for r in records) if records else {})
    result.open_waits_ms = [round(float(w), 1) for w in opens]
    result.windows, result.window_of = windows, dict(WINDOW_OF)
    result.outside = _outside(everything, records)
    # Deadline metrics over every beat with a live session: each call's whole life, from the
    # run's start (its first open) to its last close, the ramp and the drain included
    beats = [(r.release - t0, r.latency_s, r.late) for r in everything]
    offered = args.workload_obj.offered_erlangs() if args.workload_obj is not None else None
    end = max([c.ended_s or 0.0 for c in calls] + [b[0] + BEAT_S for b in beats])
    result.deadlines = deadline_metrics.summarize(calls, beats, offered, run_end_s=end)
    result.calls = deadline_metrics.records(calls)
    return result


async def _drive(args, node: Node, n: int, clock: Clock, loop_virtual: bool, cpu: dict):
    """n caller lines through the node until the measured beats ran, and `--burst` more dialled
    at once when the n are steady: (records, caller stats, refusals, open waits, the burst's
    summary). Real time: callers in load-generator processes; virtual: in this loop. The open
    waits come as call records (`wave_actors.bench.deadlines.CallRecord`), on the clock's time."""
    procs = 0 if loop_virtual else args.client_procs
    k = args.burst
    if procs:
        callers, late = Generators(node.endpoint, n, procs, args.churn, seed=args.seed), None

        def dial() -> None:
            nonlocal late
            late = Generators(node.endpoint, k, procs, args.churn, first=n, seed=args.seed)
        try:
            records = await _while_alive(callers, _measure_beats(args, node, n, clock,
                                                                 dial if k else None, cpu))
            stats, refusals, calls = await callers.finish()
            got = await late.finish() if late else ([], 0, [])
        finally:
            callers.kill()
            if late:
                late.kill()
        return records, stats + got[0], refusals, calls, _burst(k, *got[1:])
    stop = asyncio.Event()
    async with NodeClient(node.endpoint, ctx=node.ctx) as client:
        loop = asyncio.get_running_loop()
        driving = loop.create_task(drive_all(client, range(n), clock, stop, args.churn,
                                             args.seed))
        bursting: list[asyncio.Task] = []

        def dial() -> None:
            bursting.append(loop.create_task(
                drive_all(client, range(n, n + k), clock, stop, args.churn, args.seed)))
        records = await _measure_beats(args, node, n, clock, dial if k else None, cpu)
        stop.set()
        stats, refusals, calls = await driving
        got = await bursting[0] if bursting else ([], 0, [])
    return records, stats + got[0], refusals, calls, _burst(k, *got[1:])


async def _drive_workload(args, node: Node, clock: Clock):
    """The workload's calls through the node, in this process, from the first call's arrival
    to the last one's end: (every beat with live sessions, the closed stats, the call records,
    when the workload began)."""
    stop = asyncio.Event()
    async with NodeClient(node.endpoint, ctx=node.ctx) as client:
        first = len(node.clock_actor.stats.records)
        calls, stats, t0 = await drive_workload(client, args.workload_obj, clock, stop,
                                                args.seed)
    records = [r for r in node.clock_actor.stats.records[first:] if r.sessions > 0]
    return records, stats, calls, t0


def _burst(k: int, refusals: int, calls: list) -> dict:
    if not k:
        return {}
    waits = [c.wait_s for c in calls if not c.blocked]
    ms = np.array(waits) * 1000 if waits else np.zeros(1)
    p50, p99, most = np.percentile(ms, [50, 99, 100])
    return {"sessions": k, "opened": len(waits), "refused": refusals,
            "open_p50_ms": round(float(p50), 1), "open_p99_ms": round(float(p99), 1),
            "open_max_ms": round(float(most), 1)}


async def _measure_beats(args, node: Node, n: int, clock: Clock, dial=None,
                         cpu: dict | None = None) -> list:
    """Once all n sessions are live and a start-up backlog has drained, the next `--beats`
    beat records; with `dial`, it is called then (the burst) and its opens wait out in them.
    `cpu` gets the node's processes' CPU over those beats (`Node.process_cpu`). With
    `--fail-fast` a late beat anywhere, the ramp's included, ends the run at once (none
    measured when it came before them)."""
    failed = _late_seen(node) if args.fail_fast else (lambda: False)
    await _wait_live(node, n, clock, failed)
    await _wait_steady(node, clock, args.warmup_max, failed)
    if failed():
        return []
    first = len(_live_records(node))
    if dial is not None:
        dial()
    before = node.process_cpu()
    await _wait_beats(node, first, args.beats, clock, args.fail_fast)
    if cpu is not None:
        cpu.update(_cpu_spent(before, node.process_cpu(), args.beats, n, args.workers))
        # Which ways audio crossed to the engine process (shared memory, or copies in messages).
        clock_actor = node.clock_actor
        cpu.update(outputs_shared=getattr(clock_actor, "outputs_shared", False),
                   frames_shared=getattr(clock_actor, "frames_shared", False),
                   frames_read_by_executor=getattr(clock_actor, "frames_read_by_executor", False))
    return _live_records(node)[first:first + args.beats]


def _cpu_spent(before: dict, after: dict, beats: int, n: int, workers: int) -> dict:
    """ms a beat of the front's process and the engine's, and µs a session a beat of the
    session workers (all workers together); None where a process's CPU is unknown."""
    def spent(a, b):
        return None if a is None or b is None else b - a
    front, engine = spent(before["front"], after["front"]), spent(before["engine"], after["engine"])
    pairs = list(zip(before["workers"], after["workers"]))
    worker = (None if not pairs or any(spent(a, b) is None for a, b in pairs)
              else sum(b - a for a, b in pairs))
    return {"workers": workers,
            "front_cpu_ms_per_beat": None if front is None else round(1e3 * front / beats, 2),
            "engine_cpu_ms_per_beat": None if engine is None else round(1e3 * engine / beats, 2),
            "worker_cpu_us_per_session_beat": None if worker is None
            else round(1e6 * worker / (beats * max(1, n)), 1)}


async def _while_alive(callers: Generators, work):
    """`work`, unless a load generator dies first (its sessions would never go live)."""
    task = asyncio.get_running_loop().create_task(work)
    while not task.done():
        why = callers.failed()
        if why:
            task.cancel()
            raise RuntimeError(why)
        await asyncio.wait([task], timeout=0.5)
    return task.result()


def _late_seen(node: Node):
    """Whether a beat with a live session has been late in this run (any window)."""
    return lambda: node.clock_actor.stats.late_beats > 0


async def _wait_live(node: Node, n: int, clock: Clock, failed=lambda: False) -> None:
    """Until each of the n caller lines had its first open answered: `opened` (the session is
    past its start and in the beats) or refused (slots full or draining: the run counts it);
    or until `failed()`."""
    while (not node.clock_actor.stats.recent
           or node.counters.opened + sum(node.counters.refusals.values()) < n):
        if failed():
            return
        await clock.sleep(BEAT_S)


async def _wait_steady(node: Node, clock: Clock, most: int, failed=lambda: False) -> None:
    """Warm-up: until WARMUP_BEATS beats in a row were on time (a backlog from session starts
    has drained), at most `most` beats; or until `failed()`."""
    start = node.clock_actor.stats.beats
    while node.clock_actor.stats.beats - start < most and not failed():
        recent = list(node.clock_actor.stats.recent)[-WARMUP_BEATS:]
        if node.clock_actor.stats.beats - start >= WARMUP_BEATS and max(recent) <= BEAT_S:
            return
        await clock.sleep(BEAT_S)


def _live_records(node: Node) -> list:
    return [r for r in node.clock_actor.stats.records if r.sessions > 0]


async def _wait_beats(node: Node, first: int, beats: int, clock: Clock, fail_fast: bool) -> None:
    """Until `beats` beats with live sessions ran after the first `first`; with `fail_fast`, also
    stop at the first late one (the run has failed; find-max needs no more of it)."""
    while True:
        measured = _live_records(node)[first:]
        if len(measured) >= beats or (fail_fast and node.clock_actor.stats.late_beats):
            return
        await clock.sleep(BEAT_S)


def measure(args, n: int, backend=None) -> list[RunResult]:
    results = []
    for r in range(args.runs):
        loop = new_loop(virtual=args.virtual)
        # run r draws from `--seed` + r (callers and a backend of its own): runs of one
        # command differ from each other, and the command gives the same runs every time
        run_args = argparse.Namespace(**{**vars(args), "seed": args.seed + r})
        if args.workload:           # a generator draws run r's calls from its own seed
            run_args.workload_obj = load_workload(args.workload, args.seed + r,
                                                  **workload_context(args))
        try:
            res = loop.run_until_complete(run_once(run_args, n, args.virtual, backend))
        finally:
            loop.close()
        print_run(args, n, r, res)
        results.append(res)
        if args.fail_fast and res.late_beats:
            print(f"  N={n:4d}: late beat, stopping this N (--fail-fast)", flush=True)
            break
    return results


def find_max(args, backend=None, ceiling: int | None = None) -> tuple[int, dict[int, list[RunResult]]]:
    """Largest N with zero late beats in every run: doubling, then bisection; never above the
    memory `ceiling` where the backend knows it."""
    seen: dict[int, list[RunResult]] = {}

    def ok(n: int) -> bool:
        if ceiling is not None and n > ceiling:
            print(f"  N={n:4d}: above the memory ceiling of {ceiling} sessions", flush=True)
            return False
        try:
            seen[n] = measure(args, n, backend)
        except MemoryError as exc:
            print(f"  N={n:4d}: does not fit: {exc}", flush=True)
            return False
        return all(r.late_beats == 0 and r.refusals == 0 for r in seen[n])

    lo, hi = 0, args.sessions
    top = min(args.max_find, ceiling) if ceiling is not None else args.max_find
    while ok(hi):
        if hi >= top:
            return hi, seen
        lo, hi = hi, min(hi * 2, top)
    while hi - lo > max(args.find_step, lo // 50):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, seen


def workload_context(args) -> dict:
    """What a workload spec may leave to the bench: the node's slots (an occupancy's share of
    them) and the beats to measure after its fill."""
    return {"slots": max(args.sessions, args.max_sessions or 0), "beats": args.beats}
