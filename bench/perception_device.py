"""`python bench/perception_device.py --out bench/results/stage2-perception-h200.json`: issue 18's
stage-2 target on a GPU — perception's whole streaming step (both frames of a beat, every
session) as one task-table launch, against the same step in a CUDA graph.

- `task table`: `gpu.wpk.stages.perception_stage` (the model's own step: subsampling, 24
  Conformer layers with their attention ring and convolution cache, the projection) traced in
  fp32, compiled and lowered (`gpu.wpk.lower`: every kernel a task op) with its GEMM weights
  held in bf16, then run as one cooperative launch of `task_program` a beat on `programs`
  programs (`--per-sm` an SM, if the compiled kernel fits). `fp32 weights` runs the same with
  fp32 weights at one session, the exactness check: its error against the fp32 model is
  the task ops' own.
- `--counters`: the task table's dependency counters, a run each: `kernel` (a counter a
  kernel, its readers wait for all of it) or tile-level (`gpu.wpk.tilecounters`): `N` blocks
  of a kernel's tiles at most, dealt to the programs by rows, or `N:round-robin`.
- `graph reference` / `graph fp32`: the same step captured in a CUDA graph and replayed, in
  the reference profile (bf16, as the engine runs perception) and in fp32.

Correctness: each task-table run's first beat against the fp32 model on the same inputs and
state (its outputs, relative to their largest value). Timing: the median of `--reps` beats,
CUDA events around each launch or replay. Each variant runs in a subprocess with a timeout (a
hang is reported, not waited for). Prints a table and writes the JSON.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.cuda_timing import child_rows, median_ms  # noqa: E402
from bench.stage2_device import first_beat, occupancy, stepper  # noqa: E402
from gpu.wpk.ir import trace  # noqa: E402
from gpu.wpk.lower import OP_NAMES, lower  # noqa: E402
from gpu.wpk import taskops as X  # noqa: E402
from gpu.wpk.schedule import NONE, Task, TaskTable  # noqa: E402
from gpu.wpk.stages import _traceable, perception_stage  # noqa: E402
from gpu.wpk.tilecounters import TileBlocks  # noqa: E402


def op_alone(low, op: int, bufs: tuple, programs: int, warps: int, reps: int) -> dict:
    """The table's tasks of one op alone, in their queues, with no waits or signals: what the
    op's tiles cost without the dependencies, on a zeroed arena, EW's index terms dropped (an
    index an EW task of the same run computes from zeros may be NaN: out of bounds)."""
    queues = [[Task(t.op, NONE, 0, NONE, t.args) for t in q if t.op == op]
              for q in low.table.queues]
    table = TaskTable(queues, 1, low.table.tensor_sizes, low.table.ops)
    rows, starts = (torch.from_numpy(a).cuda() for a in table.emit())
    counters = torch.zeros(1, dtype=torch.int32, device="cuda")
    arena, wts, args = bufs
    args = args.clone()
    ew = torch.tensor([o == X.EW for o in low.ops], device=args.device)
    for j in range(3):
        args[ew, X.EW_TERMS + 7 * j] = -1
    step = stepper(programs, warps, (rows, starts, counters, arena, wts, args))
    return {"tasks": sum(len(q) for q in queues), "ms": round(median_ms(step, reps, 2), 4)}


def counter_policy(spec: str) -> TileBlocks | None:
    """`--counters` entry: "kernel" (a counter a kernel), "N" (tile-level: at most N blocks a
    kernel, dealt by rows) or "N:round-robin"."""
    if spec == "kernel":
        return None
    blocks, _, deal = spec.partition(":")
    return TileBlocks(int(blocks), deal or "rows")


def task_table(sessions: int, weights: torch.dtype, warps: int, per_sm: int, reps: int,
               profile: bool = False, counters: str = "kernel") -> dict:
    fits, kernel = occupancy(warps)
    if per_sm > fits:
        return {"skipped": f"{per_sm} programs an SM do not fit ({fits} do: {kernel.n_regs} "
                           "registers)"}
    programs = per_sm * torch.cuda.get_device_properties(0).multi_processor_count
    t0 = time.perf_counter()
    graph = trace(**_traceable(perception_stage("full", "fp32", sessions, device="cuda")))
    low = lower(graph, sessions, programs, weight_dtype=weights,
                counters=counter_policy(counters))
    lower_s = time.perf_counter() - t0
    run = perception_stage("full", "fp32", sessions, device="cuda")
    step, bufs, err = first_beat(low, run, programs, warps)
    arena, wts, _ = bufs
    ms = median_ms(step, reps, warmup=5)
    by_op = {}
    if profile:
        arena.zero_()           # every index 0: a gather or scatter alone stays in bounds
        for op in sorted(set(low.ops)):
            by_op[OP_NAMES[op]] = op_alone(low, op, bufs, programs, warps, reps)
    return {"by_op_alone": by_op, "ms": round(ms, 4), "counters": counters,
            "programs": programs, "per_sm": per_sm, "warps": warps,
            "registers": kernel.n_regs, "kernels": len(low.compiled.kernels),
            "records": len(low.args), "tasks": sum(len(q) for q in low.table.queues),
            "joins": sum(1 for q in low.table.queues for t in q if not t.args),
            "counter_words": low.table.n_counters,
            "arena_mb": round(low.arena * 4 / 1e6, 1),
            "weights_mb": round(low.weights * wts.element_size() / 1e6, 1),
            "rel_err_vs_fp32_model": err, "lower_s": round(lower_s, 1)}


def graph(sessions: int, profile: str, reps: int) -> dict:
    run = perception_stage("full", profile, sessions, device="cuda")
    with torch.no_grad():
        run.fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run.fn()
    ms = median_ms(g.replay, reps, warmup=5)
    return {"ms": round(ms, 4)}


def child(args) -> None:
    out = []
    for n in args.sessions:
        if args.variant.startswith("graph"):
            profile = args.variant.split()[-1]
            out.append({"variant": args.variant, "sessions": n, **graph(n, profile, args.reps)})
            continue
        wdt = torch.float32 if args.variant == "fp32 weights" else torch.bfloat16
        for warps in args.warps:
            for per_sm in args.per_sm:
                for spec in (args.counters.split(",") if wdt == torch.bfloat16 else ["kernel"]):
                    out.append({"variant": args.variant, "sessions": n, "warps": warps,
                                **task_table(n, wdt, warps, per_sm, args.reps,
                                             args.profile and wdt == torch.bfloat16, spec)})
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda s: [int(v) for v in s.split(",")]     # noqa: E731
    ap.add_argument("--sessions", type=ints, default=[1, 120, 290])
    ap.add_argument("--warps", type=ints, default=[8])
    ap.add_argument("--per-sm", type=ints, default=[1, 2])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--timeout", type=int, default=240, help="seconds a variant may take")
    ap.add_argument("--profile", action="store_true",
                    help="also time each op's tasks alone (no waits), per task-table run")
    ap.add_argument("--variants", default="graph reference,graph fp32,fp32 weights,task table")
    ap.add_argument("--counters", default="kernel",
                    help="task table's dependency counters, a run each: kernel, N (tile-level, "
                         "at most N blocks a kernel, dealt by rows), N:round-robin")
    ap.add_argument("--out")
    ap.add_argument("--variant", help=argparse.SUPPRESS)         # a child's
    args = ap.parse_args()
    if args.variant:
        child(args)
        return
    rows = []
    plan = [("graph reference", args.sessions), ("graph fp32", args.sessions),
            ("fp32 weights", [1]), ("task table", args.sessions)]
    for variant, sessions in plan:
        if variant not in args.variants.split(","):
            continue
        cmd = [sys.executable, __file__, "--variant", variant, "--reps", str(args.reps),
               "--sessions", ",".join(map(str, sessions)),
               "--warps", ",".join(map(str, args.warps)),
               "--per-sm", ",".join(map(str, args.per_sm)),
               "--counters", args.counters] + ["--profile"] * args.profile
        print(f"[perception] {variant} ...", flush=True)
        rows += child_rows(cmd, args.timeout, {"variant": variant})
    print(f"{'variant':16s} {'counters':>14s} {'sessions':>8s} {'warps':>5s} {'progs':>6s} "
          f"{'regs':>5s} {'tasks':>7s} {'ms':>8s} {'rel err':>8s}")
    for r in rows:
        if "error" in r or "skipped" in r:
            print(f"{r['variant']:16s} {r.get('sessions', ''):>8} "
                  f"{(r.get('error') or r.get('skipped'))[-300:]!r}")
            continue
        print(f"{r['variant']:16s} {r.get('counters', ''):>14} {r['sessions']:8d} "
              f"{r.get('warps', ''):>5} "
              f"{r.get('programs', ''):>6} {r.get('registers', ''):>5} {r.get('tasks', ''):>7} "
              f"{r['ms']:8.3f} {r.get('rel_err_vs_fp32_model', float('nan')):8.1e}")
        for op, alone in r.get("by_op_alone", {}).items():
            print(f"    {op:14s} alone: {alone['tasks']:7d} tasks {alone['ms']:8.3f} ms")
    if args.out:
        doc = {"bench": "perception_device", "date": datetime.datetime.now(datetime.timezone.utc)
               .strftime("%Y-%m-%dT%H:%M:%SZ"),
               "commit": os.environ.get("WAVE_COMMIT", "unknown"),
               "command": "python bench/perception_device.py " + " ".join(sys.argv[1:]),
               "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "python": platform.python_version(), "rows": rows}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
