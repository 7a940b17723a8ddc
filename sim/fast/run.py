"""`python -m sim.fast`, the fast mode's runs and command line: `cfg.runs` runs of
`sim.fast.fast` as one bench result (backend `sim-fast`), printed with its speed and written."""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import sys
import time
from pathlib import Path

import sim.fast.fast
from sim.fast.fast import FastConfig, FastError, run_one
from wave_actors.bench import deadlines
from wave_actors.bench.results import RESULTS, BenchResult, WINDOW_OF, git_commit, write
from wave_actors.bench.workload import WorkloadError, load
from wave_actors.core.policy_spec import PolicyError, make_policy


def run_fast(cfg: FastConfig) -> BenchResult:
    """`cfg.runs` runs (run r from seed + r), as a bench result of backend `sim-fast`."""
    t0, runs, virtual = time.perf_counter(), [], 0.0
    for r in range(cfg.runs):
        seed = cfg.seed + r
        run_cfg = cfg if cfg.workload_spec is None or r == 0 else dataclasses.replace(
            cfg, workload=load(cfg.workload_spec, seed, slots=cfg.slots))
        res, d, run = run_one(run_cfg, seed)
        res.deadlines, res.calls = d, deadlines.records(run.calls)
        runs.append(res)
        virtual += run.virtual_s()
    wall = time.perf_counter() - t0
    extra = {"workload": cfg.workload.describe() if cfg.workload is not None else None,
             "seeds": [cfg.seed + r for r in range(cfg.runs)],
             "cost_model": cfg.cost_model, "slots": cfg.slots, "snapshot_mb": cfg.snapshot_mb,
             "virtual_s": round(virtual, 3), "wall_s": round(wall, 3),
             "speed": round(virtual / wall, 1) if wall > 0 else None}
    start = runs[0].policies["start"]
    measured = [r.windows["measured"] for r in runs]
    return BenchResult(
        "sim-fast", cfg.profile, cfg.context, runs[0].sessions, cfg.runs,
        measured[0]["beats"] if cfg.workload is not None else cfg.beats,
        sum(r.late_beats for r in runs), max(r.p50_ms for r in runs),
        max(r.p99_ms for r in runs), True, "none (modelled)", git_commit(),
        dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        cfg.command or "sim.fast.run.run_fast", {"start": {k: start[k] for k in
                                                        ("name", "class", "params")}},
        [dataclasses.asdict(r) for r in runs], extra, beats_all=sum(r.beats for r in runs),
        measured={"beats": sum(m["beats"] for m in measured),
                  "late_beats": sum(m["late_beats"] for m in measured),
                  "p50_ms": max(m.get("p50_ms", 0.0) for m in measured),
                  "p99_ms": max(m.get("p99_ms", 0.0) for m in measured)},
        window_of={"beats": "measured", "beats_all, late_beats, p50_ms, p99_ms": "all",
                   **WINDOW_OF})


def main(argv=None, command: str | None = None) -> int:
    """`python -m sim.fast`: one fast-mode run, printed (speed included) and written.
    `command`: the command line to record, when another tool (sim.run) called this one."""
    ap = argparse.ArgumentParser(prog="python -m sim.fast", description=sim.fast.fast.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=0, help="closed loop: caller lines")
    ap.add_argument("--slots", type=int, default=0, help="the node's slots (default: --lines)")
    ap.add_argument("--churn", type=float, default=0.0, metavar="SECONDS")
    ap.add_argument("--beats", type=int, default=0)
    ap.add_argument("--workload", metavar="SPEC", help="calls instead of --lines")
    ap.add_argument("--profile", choices=("reference", "dense"), default="reference")
    ap.add_argument("--context", type=int, default=1500)
    ap.add_argument("--cost-model")
    ap.add_argument("--policy", nargs="+", metavar="WORD")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--snapshot-mb", type=float, default=-1.0,
                    help="prompt snapshots' memory, MB (-1: the executors' default, 0: none)")
    ap.add_argument("--out", help=f"folder for the result JSON (default: none; e.g. {RESULTS})")
    args = ap.parse_args(argv)
    try:
        cfg = FastConfig(
            slots=args.slots or args.lines, lines=args.lines, churn_s=args.churn,
            beats=args.beats, workload=load(args.workload, args.seed,
                                            slots=args.slots or args.lines)
            if args.workload else None,
            workload_spec=args.workload,
            profile=args.profile, context=args.context, cost_model=args.cost_model,
            policy=make_policy(args.policy) if args.policy else None, seed=args.seed,
            runs=args.runs, snapshot_mb=args.snapshot_mb,
            command=command or "python -m sim.fast " + " ".join(
                sys.argv[1:] if argv is None else argv))
        result = run_fast(cfg)
    except (FastError, WorkloadError, PolicyError, OSError) as exc:
        print(f"sim.fast: {exc}", file=sys.stderr)
        return 2
    for r in result.per_run:
        print(f"N={r['sessions']}: {r['beats']} beats, p50 {r['p50_ms']:.2f} ms, p99 "
              f"{r['p99_ms']:.2f} ms, late {r['late_beats']}, opens {r['opens']} (wait p50 "
              f"{r['open_p50_ms']:.0f} / p99 {r['open_p99_ms']:.0f} ms), refusals "
              f"{r['refusals_by_reason']}")
    x = result.extra
    print(f"{x['virtual_s']:.1f} s of virtual time in {x['wall_s']:.2f} s: {x['speed']}x real "
          f"time")
    if args.out:
        print(f"written: {write(result, Path(args.out))}")
    return 0
