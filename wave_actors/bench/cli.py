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
from dataclasses import asdict
from pathlib import Path


from wave_actors.bench.results import RESULTS, WARMUP_MAX, summarize, write
from wave_actors.bench.backend import held_context, make_executor_for, memory_ceiling
from wave_actors.bench.capacity import CLIENT_PROCS, find_max, measure, workload_context
from wave_actors.bench.workload import FILL_HOLDS, WorkloadError
from wave_actors.bench.workload import load as load_workload
from wave_actors.core.sched.clock_policy import ClockPolicy
from wave_actors.core.policy_spec import PolicyError, make_policy
from wave_actors.core.registry import NAMES, SERVING_PROFILES, described, entry
from wave_actors.node.cli import sized_slots


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m wave_actors.bench", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    _model_args(ap)
    _run_args(ap)
    _node_args(ap)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    _check(ap, args)
    return args


def _model_args(ap: argparse.ArgumentParser) -> None:
    """What runs: the backend, the model and its slots."""
    ap.add_argument("--backend", choices=NAMES, default="sim", help=described())
    ap.add_argument("--profile", default="reference",
                    choices=SERVING_PROFILES)
    ap.add_argument("--config", choices=("tiny", "full"), default="full")
    ap.add_argument("--context", type=int, default=1500,
                    help="the context window every session runs at (a node's --max-context): "
                         "sessions run past it by rolling, as a node with that --max-context does")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--max-sessions", type=int, default=0, help="slots (default: --sessions)")
    ap.add_argument("--snapshot-mb", type=float, default=-1.0,
                    help="memory for prompt snapshots (-1: the backend's default, 0: every start "
                         "prefills), as the node's flag")
    ap.add_argument("--no-warm", action="store_true",
                    help="the node makes no prompt snapshot before the first caller dials (by "
                         "default it starts the empty prompt, as `python -m wave_actors.node` "
                         "does)")
    ap.add_argument("--self-size", action="store_true",
                    help="slots as the node sizes them with no --max-sessions (a device "
                         "backend: from its memory and its measured beat)")


def _run_args(ap: argparse.ArgumentParser) -> None:
    """How long, how often and with which callers."""
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


def _node_args(ap: argparse.ArgumentParser) -> None:
    """The node's own settings: start rows, beat waits, workers, policies, the workload."""
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


def _check(ap: argparse.ArgumentParser, args) -> None:
    """Flags that cannot go together, and the policies and workload they name, built."""
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
    backend, ceiling = (_device_backend(args, max_context, extra)
                        if entry(args.backend).caps.device else (None, None))
    try:
        if args.find_max:
            n, seen = find_max(args, backend, ceiling)
            runs = seen.get(n) or measure(args, n, backend)
            extra["find_max"] = {str(k): [asdict(r) for r in v] for k, v in sorted(seen.items())}
        else:
            n, runs = args.sessions, measure(args, args.sessions, backend)
        if backend is not None:
            _after_runs(args, backend, n, runs, extra)
    finally:
        if backend is not None:
            backend.close()      # its engine process unlinks what it shared
    result = summarize(args, n, runs, extra)
    path = write(result, Path(args.out))
    _print_result(args, result, n, extra)
    print(f"written: {path}")
    return 0


def _device_backend(args, max_context: int, extra: dict):
    """One model on the GPU for every run, slots for the most sessions this run may ask for;
    its facts into `extra`. Returns it and the memory ceiling."""
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
    return backend, ceiling


def _after_runs(args, backend, n: int, runs: list, extra: dict) -> None:
    """The device backend after the runs: the stock stack's baseline and the engine's facts
    (what starts cost, slow beats, memory) into `extra`."""
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


def _print_result(args, result, n: int, extra: dict) -> None:
    """The run's table, its measured window and policies, against the baseline."""
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
