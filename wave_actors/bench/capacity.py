"""The capacity benchmark: N concurrent sessions through the real node and its real sockets.

    python -m wave_actors.bench --backend sim --sessions 64 --beats 500
    python -m wave_actors.bench --backend sim --sessions 120 --beats 500 --virtual --find-max

Every session streams 80 ms chunks of speech-like audio at real-time pace over TCP. Latency is
taken at the server boundary (beat release to outputs routed). The headline numbers (late beats,
p50/p99 latency, calls that heard a late beat) count every beat that had a live session, from the
first open to the last close: the ramp while callers dial in, the `--beats` beats measured once
all are live and a warm-up is on time, and the drain while they hang up; each window is also
reported on its own (`windows` in the JSON). Underruns, drops, refusals and frames in/out cover
the whole run; the backend's and host's times and the trace cover the measured beats. `--runs R`
repeats the run; `--find-max` searches for the largest N with zero late beats (of all beats) in
every run.
`--virtual` runs node and clients on virtual time (exact, faster than real time; only for the
sim backend, whose time is modelled). Results are printed as a table and written as JSON under
bench/results/.
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import datetime as dt
import functools
import json
import multiprocessing as mp
import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from wave_actors.bench import deadlines as deadline_metrics
from wave_actors.bench.workload import FILL_HOLDS, WorkloadError
from wave_actors.bench.workload import load as load_workload
from transports.client import NodeClient
from wave_actors.bench.clients import OPEN_TIMEOUT_S, Generators, drive_all, drive_workload
from wave_actors.core.clock_policy import ClockPolicy
from wave_actors.core.contract import ExecutorOptions
from wave_actors.core.frames import BEAT_S
from wave_actors.core.policy_spec import PolicyError, load_class, make_policy
from wave_actors.core.timebase import Clock, new_loop
from wave_actors.core.registry import NAMES, described, entry, make_executor
from wave_actors.core.spread import spread_ms
from wave_actors.bench.records import (_host, _ramp, _trace, _window, _windows, _workload_window,
                                       _worst, shifted)
from wave_actors.engine.host import EngineHost
from wave_actors.engine.process import ExecutorSpec
from wave_actors.bench.provenance import provenance
from wave_actors.node.node import Node, NodeConfig
from wave_actors.node.cli import sized_slots
from wave_actors.engine.serving_process import serving_process

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
WARMUP_BEATS = 8            # on-time beats in a row before measuring
WARMUP_MAX = 64             # beats of warm-up at most
CLIENT_PROCS = max(1, min(4, (os.cpu_count() or 2) // 4))   # callers' processes, real time


# Which beats each number of a run covers (written into the bench's results as `window_of`;
# a result without it, such as the fast mode's, says nothing of its windows).
WINDOW_OF = {
    "all": "every beat with a live session, from the first open to the last close (ramp + "
           "measured + drain): beats, late_beats, p50_ms, p99_ms, max_ms, deadlines (each call "
           "over its whole life), calls, opens and open waits, refusals, underruns, dropped, "
           "frames_in, frames_out",
    "measured": "the --beats beats once every caller is live and the warm-up is on time (a "
                "workload: its window_s after the fill, else every beat): windows.measured, "
                "trace, mean_compute_ms, compute_p50_ms, compute_p99_ms, backlog_ms, live, host, "
                "first_frame",
    "ramp": "the beats before the measured ones (callers dialling in, the warm-up): "
            "windows.ramp; `ramp` breaks the backend's time down, start-only beats included",
    "drain": "the beats after the measured ones until the last close: windows.drain",
}


@dataclass
class RunResult:
    sessions: int
    beats: int            # all beats (WINDOW_OF); windows.measured.beats: the --beats window
    late_beats: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    mean_compute_ms: float
    underruns: int
    dropped: int
    refusals: int
    frames_in: int
    frames_out: int
    errors: int
    # the backend's own time per beat: what of the latency above it is host work
    compute_p50_ms: float = 0.0
    compute_p99_ms: float = 0.0
    # every measured beat in order, ms to 0.1: latency, the backend's time, the host's time
    # before the backend was called and how much of it the loop took to wake, and the frames
    # read since the previous beat: where a tail comes from
    trace: dict = field(default_factory=dict)
    # how far behind its release the first measured beat woke: a start-up backlog the warm-up
    # did not drain (every beat that still waits on it is late, whatever the beat costs)
    backlog_ms: float = 0.0
    # sessions opened in the run (with --churn, more than `sessions`), and how long their opens
    # waited for `opened` (the session's start on the model)
    opens: int = 0
    open_p50_ms: float = 0.0
    open_p99_ms: float = 0.0
    # the start and clock policies the run's node ran with: name, class, parameters and what
    # the start policy counted (beats held back, starts given up, its step's measured cost)
    policies: dict = field(default_factory=dict)
    open_max_ms: float = 0.0
    # refused opens by the node's reason, and live sessions per measured beat against those
    # offered: min / p50 / max
    refusals_by_reason: dict = field(default_factory=dict)
    live: dict = field(default_factory=dict)
    # the host's share of the beat, ms at p50 / p99 / max: how late the loop woke for the
    # release, release → the executor called, and the executor done → outputs routed; and
    # `stalls`: each late wake in the measured beats with the loop's stacks sampled meanwhile
    host: dict = field(default_factory=dict)
    # --burst: the callers dialled at once onto the steady node (the measured beats begin
    # then): how many, how long they waited for `opened` (p50 / p99 / max ms), refusals
    burst: dict = field(default_factory=dict)
    # the beats before the measured ones (sessions starting, a backlog draining): how many,
    # the backend's time p50 / p99 / max, and the slowest with what each carried
    ramp: dict = field(default_factory=dict)
    # release → the beat's first frame routed, ms at p50 / p99 / max: ahead of the beat's
    # latency when the backend finishes frame 0 early (`Capabilities.first_frame`)
    first_frame: dict = field(default_factory=dict)
    # every open's wait for `opened`, ms to 0.1, in the order they were asked (`sim.plot`)
    open_waits_ms: list = field(default_factory=list)
    # every call's record (`wave_actors.bench.deadlines.records`: dialled, opened or blocked,
    # ended, refusals, its late beats and longest run of them) and the run's deadline metrics
    calls: list = field(default_factory=list)
    deadlines: dict = field(default_factory=dict)
    # beats, late_beats, p50_ms, p99_ms, max_ms and from_s / to_s (releases, seconds from the
    # run's start) of each window: all, ramp, measured, drain (WINDOW_OF)
    windows: dict = field(default_factory=dict)
    window_of: dict = field(default_factory=dict)


@dataclass
class BenchResult:
    backend: str
    profile: str
    context: int
    sessions: int
    runs: int
    beats: int            # --beats: the measured window of each run
    late_beats: int       # of all beats of every run (beats_all); p50_ms, p99_ms: the worst run's
    p50_ms: float
    p99_ms: float
    virtual: bool
    gpu: str
    commit: str
    date: str
    command: str
    policy: dict = field(default_factory=dict)      # start and clock: name, class, parameters
    per_run: list[dict] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    beats_all: int = 0    # beats late_beats counts: all beats of every run (WINDOW_OF)
    # the measured windows alone: their beats and late beats over the runs, the worst p50 / p99
    measured: dict = field(default_factory=dict)
    window_of: dict = field(default_factory=dict)   # as RunResult's, and the top's fields
    provenance: dict = field(default_factory=dict)  # commit, dirty, changed files, from where


def held_context(args) -> tuple[int, int, int]:
    """(context_offset, max_context, roll): sessions go live holding `--context - 2 * roll`
    frames (random rows on the GPU, modelled in the simulator) and run on past `--context` by
    rolling `roll` frames at a time, the roll a node started with `--max-context` = `--context`
    uses. Over the measured beats each session rolls in turn (a few a beat, see the slot book),
    so the beats run at the rolled steady state of a node serving calls of any length: contexts
    spread over the last two rolls below `--context`, cache rows moved by the rolls included."""
    roll = ExecutorOptions(max_context=args.context).roll_frames
    return max(0, args.context - 2 * roll), args.context, roll


def memory_ceiling(args, max_context: int) -> int:
    """Sessions the device's free memory holds at this context. With --workers it is asked in
    a process of its own: this one never opens the device, which the engine process alone
    uses (a context here would take memory the engine's slots need)."""
    ask = functools.partial(load_class(entry(args.backend).target).memory_ceiling, args.config,
                            args.profile, max_context)
    if not args.workers:
        return ask()
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(ask).result()


def executor_options(args, max_n: int) -> ExecutorOptions:
    """The executor's options from the bench's flags, slots sized for `max_n` sessions."""
    offset, max_context, roll = held_context(args)
    slots = 0 if args.self_size else max(max_n, args.max_sessions or 0)
    return ExecutorOptions(max_sessions=slots, profile=args.profile,
                           config=args.config, max_context=max_context, context_offset=offset,
                           cost_model=args.cost_model, seed=args.seed, context_roll=roll,
                           beat_wait=args.beat_wait, start_rows=args.start_rows,
                           first_poll_ms=args.first_poll_ms, snapshot_mb=args.snapshot_mb)


def make_executor_for(args, max_n: int, clock: Clock | None = None):
    """One backend for the whole benchmark: a GPU model is built once and serves every run (each
    run is a fresh node whose sessions reset their slots). Slots are sized for `max_n` sessions."""
    opts = executor_options(args, max_n)
    if args.workers:      # built in the engine process, which serves every run's node
        return EngineHost(ExecutorSpec(args.backend, opts)).start()
    return make_executor(args.backend, opts, clock)


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
                           workers=0 if loop_virtual else args.workers),
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
    finally:
        await node.drain()
        if own:
            backend.close()
    # what the start policy learned, as the clock that ran it left it: a worker engine's clock
    # sends its copy back when it stops (the front's is the one it was given)
    policies["start"] = getattr(ran, "start_policy", node.start_policy).describe()
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
                       refusals, sum(s["frames_in"] for s in stats),
                       sum(s["frames_out"] for s in stats), errors,
                       float(np.percentile(gpu, 50)), float(np.percentile(gpu, 99)),
                       _trace(records), round(1000 * records[0].wake_s, 1) if records else 0.0,
                       len(waits), float(open_p50), float(open_p99), policies,
                       float(open_max), dict(refused_by), live_seen, _host(records, stalls, cpu),
                       burst, ramp, spread_ms(r.first_s for r in records) if records else {})
    result.open_waits_ms = [round(float(w), 1) for w in opens]
    result.windows, result.window_of = windows, dict(WINDOW_OF)
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
        print(f"  N={n:4d} run {r + 1}/{args.runs}: p50 {res.p50_ms:7.2f} ms  p99 "
              f"{res.p99_ms:7.2f} ms  late {res.late_beats:3d}/{res.beats} (all beats)  "
              f"underruns {res.underruns}  dropped {res.dropped}  (backend p50 "
              f"{res.compute_p50_ms:.1f} / p99 {res.compute_p99_ms:.1f} ms, measured beats)",
              flush=True)
        print(f"           by window: {_by_window(res.windows)}", flush=True)
        if res.first_frame and res.first_frame["p99"] < res.p99_ms:
            f = res.first_frame
            print(f"           first frame routed {f['p50']:.2f} / {f['p99']:.2f} ms after the "
                  f"release (p50 / p99), while the second computes", flush=True)
        if res.trace.get("latency_ms"):
            print(f"           worst beats: {_worst(res.trace)}", flush=True)
        print(f"           {res.opens} sessions opened, waiting {res.open_p50_ms:.0f} ms at p50 / "
              f"{res.open_p99_ms:.0f} ms at p99 / {res.open_max_ms:.0f} ms at most for `opened` "
              f"(their start on the model)"
              + (f"; refused by reason: {res.refusals_by_reason}" if res.refusals else ""),
              flush=True)
        if res.burst:
            b = res.burst
            print(f"           burst of {b['sessions']}: {b['opened']} opened, waiting "
                  f"{b['open_p50_ms']:.0f} / {b['open_p99_ms']:.0f} / {b['open_max_ms']:.0f} ms "
                  f"(p50 / p99 / max) for `opened`; {b['refused']} refused", flush=True)
        if res.host:
            h = res.host
            print(f"           host: the loop woke for the release {h['wake_ms']['p50']:.1f} / "
                  f"{h['wake_ms']['p99']:.1f} / {h['wake_ms']['max']:.1f} ms late (p50 / p99 / "
                  f"max); release to executor p99 {h['before_ms']['p99']:.1f} ms; executor done "
                  f"to outputs routed p99 {h['after_ms']['p99']:.1f} ms; both p99 "
                  f"{h['before_after_ms']['p99']:.1f} ms", flush=True)
            print(f"           CPU a beat: the loop's thread {h['loop_cpu_ms']['p50']:.1f} / "
                  f"{h['loop_cpu_ms']['p99']:.1f} ms (p50 / p99; "
                  f"{h['loop_cpu_us_per_session']:.0f} µs a live session), the process "
                  f"{h['process_cpu_ms']['p50']:.1f} / {h['process_cpu_ms']['p99']:.1f} ms, "
                  f"of it the executor's own {h['executor_cpu_ms']['p50']:.1f} ms",
                  flush=True)
            pc = h.get("processes") or {}
            if pc.get("workers"):
                print(f"           processes: {pc['workers']} session workers "
                      f"{pc['worker_cpu_us_per_session_beat']} µs a session a beat; the front "
                      f"{pc['front_cpu_ms_per_beat']} ms a beat, the engine "
                      f"{pc['engine_cpu_ms_per_beat']} ms a beat", flush=True)
            for st in h.get("stalls", [])[:3]:
                top = st["stacks"][0] if st["stacks"] else {"samples": 0, "frames": []}
                print(f"           stall: woke {st['late_ms']:.1f} ms late; {top['samples']} of "
                      f"{st['samples']} samples in " + " <- ".join(top["frames"][:3]), flush=True)
        if res.ramp:
            rp = res.ramp
            print(f"           ramp: {rp['beats']} beats before the measured ones (start-only "
                  f"beats too), backend "
                  f"{rp['compute_ms']['p50']:.1f} / {rp['compute_ms']['p99']:.1f} / "
                  f"{rp['compute_ms']['max']:.1f} ms; slowest: "
                  + "  ".join(f"{b['compute_ms']:.0f} ms @{b['beat']} ({b['sessions']} live, "
                              f"{b['rows']} rows, {b['resets']} resets, {b['rolls']} rolls)"
                              for b in rp["slowest"][:4]), flush=True)
        if res.live:
            print(f"           live sessions in the measured beats: {res.live['min']} to "
                  f"{res.live['max']} (p50 {res.live['p50']:.0f}) of {res.live['offered']} "
                  f"offered", flush=True)
        if res.deadlines:
            d = res.deadlines
            load = (f" ({d['offered_erlangs']} Erlangs)" if d["offered_erlangs"] is not None
                    else "")
            print(f"           calls: {d['calls']} offered{load}, "
                  f"{d['blocked']} blocked ({100 * d['blocking']:.2f} %), "
                  f"{d['calls_with_late_beats']} heard a late beat in their whole life "
                  f"(longest run {d['longest_late_run_beats']} beats); "
                  f"{d['glitch_s_per_call_hour']} glitch-seconds a call-hour; open wait p50 / p99 "
                  f"{d['open_wait'].get('p50_ms')} / {d['open_wait'].get('p99_ms')} ms",
                  flush=True)
        if res.backlog_ms > 1000 * BEAT_S and not args.workload:
            print(f"           the measured beats began {res.backlog_ms / 1000:.2f} s behind the "
                  f"release schedule: the node was still behind after {args.warmup_max} beats of "
                  f"warm-up (a start-up backlog not drained yet, or beats slower than "
                  f"{1000 * BEAT_S:.0f} ms; a larger --warmup-max waits longer for a backlog)",
                  flush=True)
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


def git_commit() -> str:
    """The commit the code ran at, from git or the tree's checked manifest (see
    `wave_actors.bench.provenance`, which also says whether the tree differed from it)."""
    return provenance()["commit"]


def _gpu_name() -> str:
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"none ({platform.processor() or platform.machine()})"


def _by_window(windows: dict) -> str:
    """'ramp 40 beats, 2 late, p99 171.0 ms; measured ...': each window of a run."""
    def one(name: str) -> str:
        w = windows.get(name) or {"beats": 0}
        if not w["beats"]:
            return f"{name} 0 beats"
        return (f"{name} {w['beats']} beats, {w['late_beats']} late, p50 / p99 "
                f"{w['p50_ms']:.1f} / {w['p99_ms']:.1f} ms")
    return "; ".join(one(k) for k in ("ramp", "measured", "drain"))


def summarize(args, n: int, runs: list[RunResult], extra: dict) -> BenchResult:
    policy = {kind: {k: d[k] for k in ("name", "class", "params")}
              for kind, d in runs[0].policies.items()} if runs and runs[0].policies else {}
    measured = [r.windows.get("measured") or {"beats": 0, "late_beats": 0} for r in runs]
    prov = provenance()
    return BenchResult(args.backend, args.profile, args.context, n, len(runs), args.beats,
                       sum(r.late_beats for r in runs), max(r.p50_ms for r in runs),
                       max(r.p99_ms for r in runs), args.virtual, _gpu_name(), prov["commit"],
                       dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                       getattr(args, "command", None)
                       or "python -m wave_actors.bench " + " ".join(sys.argv[1:]),
                       policy, [asdict(r) for r in runs], extra,
                       beats_all=sum(r.beats for r in runs),
                       window_of={"beats": "measured", "beats_all, late_beats, p50_ms, p99_ms":
                                  "all", **WINDOW_OF},
                       measured={"beats": sum(m["beats"] for m in measured),
                                 "late_beats": sum(m["late_beats"] for m in measured),
                                 "p50_ms": max((m.get("p50_ms", 0.0) for m in measured),
                                               default=0.0),
                                 "p99_ms": max((m.get("p99_ms", 0.0) for m in measured),
                                               default=0.0)},
                       provenance=prov)


def write(result: BenchResult, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = result.date.replace(":", "").replace("-", "")[:15]
    path = out_dir / f"{result.backend}-{result.profile}-n{result.sessions}-{stamp}.json"
    path.write_text(json.dumps(asdict(result), indent=1) + "\n")
    return path


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m wave_actors.bench", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--backend", choices=NAMES, default="sim", help=described())
    ap.add_argument("--profile", choices=("reference", "dense"), default="reference")
    ap.add_argument("--config", choices=("tiny", "full"), default="full")
    ap.add_argument("--context", type=int, default=1500,
                    help="the context window every session runs at (a node's --max-context): "
                         "sessions run past it by rolling, as a node with that --max-context does")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--max-sessions", type=int, default=0, help="slots (default: --sessions)")
    ap.add_argument("--snapshot-mb", type=float, default=-1.0,
                    help="memory for prompt snapshots (-1: the backend's default, 0: every start "
                         "prefills), as the node's flag")
    ap.add_argument("--self-size", action="store_true",
                    help="slots as the node sizes them with no --max-sessions (a device "
                         "backend: from its memory and its measured beat)")
    ap.add_argument("--beats", type=int, default=500,
                    help="beats in the measured window, once every caller is live and the "
                         "warm-up is on time (a workload: after its fill); the headline late "
                         "beats and p50/p99 count every beat from the first open to the last "
                         "close, this window's are reported apart")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--warmup-max", type=int, default=WARMUP_MAX,
                    help="beats to wait at most for a start-up backlog to drain")
    ap.add_argument("--find-max", action="store_true")
    ap.add_argument("--fail-fast", action="store_true",
                    help="end a run at its first late beat, in any window (and skip that N's "
                         "other runs); on by default with --find-max")
    ap.add_argument("--max-find", type=int, default=1024)
    ap.add_argument("--find-step", type=int, default=1,
                    help="find-max stops when the bracket is this narrow (fewer probes)")
    ap.add_argument("--virtual", action="store_true", help="virtual time (sim backend only)")
    ap.add_argument("--cost-model", help="sim: JSON of cost-model parameters")
    ap.add_argument("--seed", type=int, default=0,
                    help="every random choice: callers' call lengths and audio, the sim's "
                         "jitter; run r of --runs uses seed + r (recorded under extra.seeds)")
    ap.add_argument("--burst", type=int, default=0, metavar="N",
                    help="once the --sessions callers are steady, N more dial at once; the "
                         "measured beats begin then, and their opens are reported apart")
    ap.add_argument("--churn", type=float, default=0.0, metavar="SECONDS",
                    help="calls end and new ones start: each session lives an exponential time "
                         "of this mean, and its caller opens a new one (default 0: sessions "
                         "live the whole run); a closed loop, every slot busy: its open-loop "
                         "companion is --workload poisson:occupancy=X,hold=SECONDS")
    ap.add_argument("--start-rows", type=int, default=0,
                    help="starting sessions each beat advances (0: the backend's default)")
    ap.add_argument("--beat-wait", choices=("poll", "thread"), default="poll",
                    help="graph: the loop polls the beat's CUDA event, or a worker thread waits")
    ap.add_argument("--first-poll-ms", type=float, default=0.0,
                    help="graph, wpk: frame 0's count polled every loop turn from just before "
                         "the fastest recent frame 0 (0), or slept to it and polled every this "
                         "many ms")
    ap.add_argument("--workers", type=int, default=0,
                    help="session worker processes of the node (real time only; 0: the "
                         "sessions run on the node's own loop)")
    ap.add_argument("--client-procs", type=int, default=CLIENT_PROCS,
                    help="load-generator processes for the sessions (0: the callers share the "
                         "node's process; --virtual always does)")
    ap.add_argument("--policy", nargs="+", metavar="WORD",
                    help="start policy: guarded | eager | budgeted | headroom | forecast | "
                         "module:Class, then key=value parameters (default: the node's, "
                         "guarded); recorded in the result")
    ap.add_argument("--release-hold-ms", type=float, default=1e3 * ClockPolicy().release_hold_s,
                    help="clock policy: session actors' output work waits this long before a "
                         "release until the beat is queued (0: off)")
    ap.add_argument("--hold-inputs", action="store_true",
                    help="clock policy: client audio waits through the same hold")
    ap.add_argument("--output-slice", type=int, default=ClockPolicy().output_slice,
                    help="clock policy: sessions that start their output work in one turn of "
                         "the event loop (0: all at once)")
    ap.add_argument("--frames-every-ms", type=float,
                    default=1e3 * ClockPolicy().frames_every_s,
                    help="clock policy: how often the clock reads the workers' frame batches "
                         "(0: as they arrive)")
    ap.add_argument("--workload", metavar="SPEC",
                    help="calls from a workload instead of --sessions steady callers: a CSV or "
                         "JSONL file, or a generator (poisson:rate=2,duration=600,call=90; "
                         "see wave_actors/bench/workload.py); --sessions is then the node's slots, "
                         "and the run lasts until the last call ends.\n"
                         "poisson:occupancy=0.95,hold=120: Poisson arrivals at rate "
                         "occupancy * slots / hold (slots: --sessions, or slots=N), call "
                         "lengths exponential of mean hold seconds; without duration=, calls "
                         f"arrive for a fill of {FILL_HOLDS:g} holds plus --beats beats, and "
                         "those beats after the fill are the measured window")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    if args.virtual and not entry(args.backend).caps.modelled_time:
        ap.error(f"--virtual needs an executor with modelled time (sim): {args.backend} "
                 f"takes real time")
    try:
        args.start_policy = make_policy(args.policy) if args.policy else None
        args.clock_policy = ClockPolicy(release_hold_s=args.release_hold_ms / 1e3,
                                        hold_inputs=args.hold_inputs,
                                        output_slice=args.output_slice,
                                        frames_every_s=args.frames_every_ms / 1e3)
    except (PolicyError, ValueError) as exc:
        ap.error(str(exc))
    if args.workers and args.virtual:
        ap.error("--workers runs the node in several processes: real time only (not --virtual)")
    if args.workers < 0:
        ap.error("--workers must be >= 0")
    if args.sessions < 1 or args.beats < 1 or args.runs < 1:
        ap.error("--sessions, --beats and --runs must be positive")
    if not args.churn >= 0:
        ap.error("--churn must be a mean call length in seconds, >= 0")
    if args.burst < 0 or (args.burst and args.find_max):
        ap.error("--burst is a count of callers (>= 0), and not for --find-max")
    args.fail_fast = args.fail_fast or args.find_max
    args.workload_obj = None
    if args.workload:
        if args.find_max or args.burst or args.churn:
            ap.error("--workload sets the calls: not with --find-max, --burst or --churn")
        try:
            args.workload_obj = load_workload(args.workload, args.seed, **workload_context(args))
        except WorkloadError as exc:
            ap.error(str(exc))
    return args


def workload_context(args) -> dict:
    """What a workload spec may leave to the bench: the node's slots (an occupancy's share of
    them) and the beats to measure after its fill."""
    return {"slots": max(args.sessions, args.max_sessions or 0), "beats": args.beats}


def main(argv=None, command: str | None = None) -> int:
    """`command`: the command line to record, when another tool (sim.run) called this one."""
    args = parse_args(argv)
    args.command = command
    offset, max_context, roll = held_context(args)
    # how the measured context was held: every session cycles between these by rolling
    extra: dict = {"context_held": {"from": offset, "to": max_context, "roll": roll},
                   "seeds": [args.seed + r for r in range(args.runs)]}
    if args.workload_obj is not None:
        extra["workload"] = args.workload_obj.describe()
    backend, ceiling = None, None
    if entry(args.backend).caps.device:
        # One model on the GPU for every run, slots for the most sessions this run may ask for.
        ceiling = memory_ceiling(args, max_context)
        print(f"memory ceiling at this context: {ceiling} sessions", flush=True)
        slots = min(args.max_find, ceiling) if args.find_max else args.sessions + args.burst
        backend = make_executor_for(args, slots)
        extra["engine"] = backend.describe()
        if extra["engine"].get("slots"):
            print(f"slots: {sized_slots(extra['engine']['slots'])}", flush=True)
        rows = extra["engine"].get("start_rows")
        if rows:
            print(f"start rows: up to {rows['rows']} × {rows['chunk']} prompt positions in a beat "
                  f"that starts sessions: {rows['beat_with_rows_ms']} ms against "
                  f"{rows['beat_ms']} ms for {rows['at_sessions']} sessions (idle caches); ms "
                  f"added by the rows a capture holds: {rows.get('added_ms_by_rows')}", flush=True)
    try:
        if args.find_max:
            n, seen = find_max(args, backend, ceiling)
            runs = seen.get(n) or measure(args, n, backend)
            extra["find_max"] = {str(k): [asdict(r) for r in v] for k, v in sorted(seen.items())}
        else:
            n, runs = args.sessions, measure(args, args.sessions, backend)
        if backend is not None:
            try:
                base = backend.baseline(args.context)
            except Exception as exc:     # a node filled to its memory has none to spare for it
                base = {"error": f"{type(exc).__name__}: {str(exc)[:200]}",
                        "sessions_on_time": 0}
            extra["baseline"] = base
            # The stock stack is credited with one session even when its beat misses the deadline.
            extra["sessions_ratio"] = n / max(1, base["sessions_on_time"])
            facts = backend.describe()
            extra["engine_after"] = facts
            starts = runs[-1].policies.get("start", {}) if runs else {}
            rows = facts.get("start_rows") or {}
            print(f"session starts ({starts.get('name')} policy): {rows.get('rows')} start rows of "
                  f"{rows.get('chunk')} prompt positions add {rows.get('added_ms')} ms to the "
                  f"{rows.get('at_sessions')}-session beat (measured at build); "
                  f"{starts.get('held_back')} beats held their start rows back", flush=True)
            if "launch_ms" in facts:
                print(f"executor: the worker launched a beat in {facts['launch_ms']} ms; allocator "
                      f"{facts.get('allocator')}", flush=True)
            for b in facts.get("slow_beats", [])[-8:]:
                print(f"           slow beat {b['beat']}: {b['done_ms']} ms ({b['launch_ms']} ms "
                      f"to launch), {b['live']} live, {b['rows']} rows, {b['resets']} resets, "
                      f"{b['rolls']} rolls; allocator {b['allocator']}", flush=True)
            extra["memory_used_bytes"] = facts["memory_used_bytes"]
            extra["memory_ceiling_sessions"] = facts["memory_ceiling_sessions"]
    finally:
        if backend is not None:
            backend.close()      # its engine process unlinks what it shared
    result = summarize(args, n, runs, extra)
    path = write(result, Path(args.out))
    print(f"\n{'backend':8} {'profile':10} {'context':>7} {'sessions':>8} {'runs':>4} "
          f"{'beats':>6} {'late':>5} {'p50 ms':>8} {'p99 ms':>8}   (all beats: first open to "
          f"last close)")
    print(f"{result.backend:8} {result.profile:10} {result.context:7d} {result.sessions:8d} "
          f"{result.runs:4d} {result.beats_all:6d} {result.late_beats:5d} {result.p50_ms:8.2f} "
          f"{result.p99_ms:8.2f}")
    m, wl = result.measured, args.workload_obj
    where = (f"--beats {result.beats} a run, once all callers were live" if wl is None
             else f"the workload's window {list(wl.window_s)} s, after its fill" if wl.window_s
             else "every beat: a workload without a fill")
    print(f"of which measured ({where}): {m['beats']} beats, {m['late_beats']} late, "
          f"p50 / p99 {m['p50_ms']:.2f} / {m['p99_ms']:.2f} ms")
    for kind, pol in result.policy.items():
        print(f"{kind} policy: {pol['name']} ({pol['class']}) {pol['params']}")
    if "baseline" in extra and "error" not in extra["baseline"]:
        b = extra["baseline"]
        print(f"baseline (reference model, one session at a time, eager): beat {b['beat_ms_p50']:.1f}"
              f" ms -> {b['sessions_on_time']} sessions on time per GPU; engine {n} sessions "
              f"({extra['sessions_ratio']:.0f}x, crediting the baseline with at least one)")
    print(f"written: {path}")
    return 0

