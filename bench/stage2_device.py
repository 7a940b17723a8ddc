"""`python bench/stage2_device.py --out bench/results/stage2-ffn-h200.json`: issue 18's stage 2 on
a GPU, first measurement: do the library's task ops run perception's matmuls as fast as the
graph does?

Perception's 48 feed-forward half-steps (24 layers × 2; d 1024, hidden 4096, bf16 weights, no
biases: ~0.8 GB of its 1.2 GB of weights) over the beat's rows (2 frames × sessions):

- `task table`: `gpu.wpk.taskrun.ffn_chain` as one cooperative launch of `task_program` (4
  kernels a half-step, every tile of a kernel waiting on a counter for all tiles of the one
  before; the second GEMM split-K as the lowering would split it), on `programs` programs
  sized from the compiled kernel's registers and shared memory; GEMM tile shapes compared in
  subprocesses (`WAVE_WPK_GEMM_TILE`, a module constant).
- `lowered`: the model's own Conformer layers (their feed-forward halves and norms) traced to
  the IR, compiled and lowered onto the task ops (`gpu.wpk.lower`), GEMM weights held in bf16:
  the stage-2 path end to end; its error is against the fp32 model (not teacher-forced).
- `graph`: the same half-steps as the engine's perception runs them, captured in a CUDA graph:
  cuBLAS linear, SiLU, cuBLAS linear, and the engine's fused add + layer norm (`add_layer_norm`
  with its second norm: the next half-step's input norm comes out of the same launch).

Correctness: every half-step of the task table's first beat, teacher-forced, against PyTorch
(`taskrun.ffn_reference`: x's tile rounded to bf16 as the task op's is, fp32 sums), the worst
relative error printed and recorded. Timing: the median of `--reps` beats, CUDA events around
each launch (graph: each replay). Prints a table and writes the JSON.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.cuda_timing import child_rows, median_ms  # noqa: E402
from gpu.kernels.layer_norm import add_layer_norm  # noqa: E402
from gpu.wpk import taskrun as T  # noqa: E402  (its tiles: WAVE_WPK_GEMM_TILE)
from gpu.wpk.ir import trace  # noqa: E402
from gpu.wpk.lower import lower  # noqa: E402
from gpu.wpk.stages import feed_forward_stage  # noqa: E402

D, HIDDEN, HALF_STEPS = 1024, 4096, 48


@functools.lru_cache(maxsize=1)
def weights_of(layers: int) -> list[tuple]:
    """Per half-step (W₁ [4096, 1024], W₂ [1024, 4096]) bf16 on the GPU, N(0, 1/fan_in), the
    same for every variant of a process (seeded); γ 1, β 0."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    return [((torch.randn(HIDDEN, D, generator=gen, device="cuda") / D ** 0.5).bfloat16(),
             (torch.randn(D, HIDDEN, generator=gen, device="cuda") / HIDDEN ** 0.5).bfloat16())
            for _ in range(layers)]


def stepper(programs: int, warps: int, bufs: tuple):
    """One beat a call: `task_program` over `bufs` (rows, starts, counters, arena, weights,
    args), cooperatively (a grid that cannot be co-resident fails instead of hanging)."""
    beat = [0]

    def step():
        beat[0] += 1
        T.task_program[(programs,)](*bufs, beat[0], 0, TILE=16, BLOCK_N=16, IS_INTERP=False,
                                    num_warps=warps, launch_cooperative_grid=True)
    return step


def task_table(rows: int, layers: int, warps: int, per_sm: int, reps: int) -> dict:
    ws = weights_of(layers)
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def build(programs):
        # split-K as the lowering picks it: parts of two K tiles or more, until tiles fill
        tiles = -(-rows // T.GEMM_TILE_M) * -(-D // T.GEMM_TILE_N)
        parts = max(1, min(HIDDEN // (2 * T.GEMM_TILE_K), -(-programs // tiles)))
        block = T.ffn_chain(rows, D, HIDDEN, programs, layers, bias=False, split_k=parts)
        table_rows, starts = (torch.from_numpy(a).cuda() for a in block.table.emit())
        counters = torch.zeros(block.table.n_counters, dtype=torch.int32, device="cuda")
        arena = torch.zeros(block.arena, device="cuda")
        weights = torch.zeros(block.weights, dtype=torch.bfloat16, device="cuda")
        for l, (w1, w2) in enumerate(ws):
            block.wview(weights, f"w1.{l}").copy_(w1)
            block.wview(weights, f"w2.{l}").copy_(w2)
        for l in range(layers):
            for g in ("g1", "g2"):
                block.view(arena, f"{g}.{l}").fill_(1.0)
        block.view(arena, "x.0").copy_(torch.randn(rows, D, generator=torch.Generator()
                                                   .manual_seed(1)).cuda())
        args = torch.from_numpy(block.args).cuda()
        return block, (table_rows, starts, counters, arena, weights, args)

    fits, kernel = occupancy(warps)
    if per_sm > fits:
        return {"skipped": f"{per_sm} programs an SM do not fit ({fits} do: {kernel.n_regs} "
                           f"registers, {kernel.metadata.shared} B shared)"}
    programs = per_sm * sms
    block, bufs = build(programs)
    step = stepper(programs, warps, bufs)
    step()
    torch.cuda.synchronize()
    arena, weights = bufs[3], bufs[4]
    worst = 0.0
    for l in range(layers):
        for name, ref in T.ffn_reference(block, arena, weights, l).items():
            got = block.view(arena, f"x.{l + 1}" if name == "x" else f"{name}.{l}")
            got = got.sum(0) if name == "h2" else got           # split-K partials
            worst = max(worst, ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item())
    ms = median_ms(step, reps, warmup=5)
    tiles = sum(len(q) for q in block.table.queues)
    return {"ms": round(ms, 4), "programs": programs, "per_sm": per_sm, "warps": warps,
            "registers": kernel.n_regs, "shared_bytes": kernel.metadata.shared,
            "fits_per_sm": fits, "tasks": tiles, "kernels": block.table.n_counters,
            "split_k": int(block.args[2][9]),
            "worst_rel_err": worst, "weight_tb_s": round(weight_bytes(layers) / ms / 1e9, 3)}


def occupancy(warps: int) -> tuple[int, object]:
    """(programs an SM that can be co-resident, the compiled kernel), from a launch of the
    program on an empty table (the same kernel as every table's)."""
    z = lambda *shape, dt=torch.int32: torch.zeros(*shape, dtype=dt, device="cuda")  # noqa: E731
    kernel = T.task_program[(1,)](z(8), z(2), z(1), z(1, dt=torch.float32),
                                  z(1, dt=torch.bfloat16), z(T.ARGS), 1, 0, TILE=16, BLOCK_N=16,
                                  IS_INTERP=False, num_warps=warps)
    torch.cuda.synchronize()
    props = torch.cuda.get_device_properties(0)
    regs_per_sm = getattr(props, "regs_per_multiprocessor", 65536)
    smem_per_sm = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    by_regs = regs_per_sm // max(1, kernel.n_regs * 32 * warps)
    by_smem = smem_per_sm // kernel.metadata.shared if kernel.metadata.shared else 64
    return max(1, min(by_regs, by_smem, 32 // warps)), kernel


@functools.lru_cache(maxsize=1)
def traced(rows: int, layers: int):
    run = feed_forward_stage("full", rows, layers=layers // 2, device="cuda")
    return run, trace(run.fn, run.named)


@functools.lru_cache(maxsize=2)
def lowering(rows: int, layers: int, programs: int):
    run, graph = traced(rows, layers)
    return run, lower(graph, rows, programs, weight_dtype=torch.bfloat16)


def lowered(rows: int, layers: int, warps: int, per_sm: int, reps: int) -> dict:
    """The model's own layers (`gpu.wpk.stages.feed_forward_stage`, fp32) traced, compiled and
    lowered (`gpu.wpk.lower`, GEMM weights held in bf16), one launch a beat."""
    fits, kernel = occupancy(warps)
    if per_sm > fits:
        return {"skipped": f"{per_sm} programs an SM do not fit ({fits} do)"}
    programs = per_sm * torch.cuda.get_device_properties(0).multi_processor_count
    run, low = lowering(rows, layers, programs)
    step, (arena, _, _), err = first_beat(low, run, programs, warps)
    ms = median_ms(step, reps, warmup=5)
    return {"ms": round(ms, 4), "programs": programs, "per_sm": per_sm, "warps": warps,
            "registers": kernel.n_regs, "kernels": len(low.compiled.kernels),
            "split_k": max(int(r[9]) for r in low.args),
            "tasks": sum(len(q) for q in low.table.queues),
            "rel_err_vs_fp32_model": err,
            "weight_tb_s": round(weight_bytes(layers) / ms / 1e9, 3)}


def first_beat(low, run, programs: int, warps: int) -> tuple:
    """A lowered stage on the GPU: (one beat a call, (arena, weights, args), the first beat's
    worst error against `run`'s own step on the same inputs, relative to each output's
    largest value)."""
    arena, weights = low.load(run.tensors(), "cuda")
    table_rows, starts = (torch.from_numpy(a).cuda() for a in low.table.emit())
    args = torch.from_numpy(low.args).cuda()
    counters = torch.zeros(low.table.n_counters, dtype=torch.int32, device="cuda")
    step = stepper(programs, warps, (table_rows, starts, counters, arena, weights, args))
    step()
    torch.cuda.synchronize()
    with torch.no_grad():
        want = run.fn()
    err = max(((got - ref).abs().max() / ref.abs().max()).item()
              for got, ref in zip(low.outputs(arena), want))
    return step, (arena, weights, args), err


def weight_bytes(layers: int) -> int:
    return layers * 2 * D * HIDDEN * 2


def graph(rows: int, layers: int, reps: int) -> dict:
    ws = weights_of(layers)
    one, zero = torch.ones(D, device="cuda", dtype=torch.bfloat16), torch.zeros(
        D, device="cuda", dtype=torch.bfloat16)
    x0 = torch.randn(rows, D, generator=torch.Generator().manual_seed(1)).cuda().bfloat16()

    def chain():
        x = x0
        u = F.layer_norm(x, (D,), one, zero, 1e-5)
        for w1, w2 in ws:
            y = F.linear(F.silu(F.linear(u, w1)), w2)
            _, x, u = add_layer_norm(x, y, 0.5, one, zero, 1e-5, one, zero)
        return x

    chain()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        chain()
    ms = median_ms(g.replay, reps, warmup=5)
    return {"ms": round(ms, 4), "launches": 1 + 4 * layers,
            "weight_tb_s": round(weight_bytes(layers) / ms / 1e9, 3)}


def child(args) -> None:
    rows = [2 * s for s in args.sessions]
    out = []
    for r in rows:
        if args.tile == "graph":
            out.append({"variant": "graph", "rows": r, **graph(r, args.layers, args.reps)})
            continue
        for warps in args.warps:
            for per_sm in args.per_sm:
                if args.tile.startswith("lowered"):
                    res = lowered(r, args.layers, warps, per_sm, args.reps)
                    out.append({"variant": "lowered from the IR", "rows": r, "warps": warps,
                                "tile": os.environ["WAVE_WPK_GEMM_TILE"], **res})
                    continue
                res = task_table(r, args.layers, warps, per_sm, args.reps)
                out.append({"variant": f"task table {args.tile}", "tile": args.tile, "rows": r,
                            "warps": warps, **res})
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=lambda s: [int(v) for v in s.split(",")],
                    default=[1, 120, 290])
    ap.add_argument("--tiles", default="64,64,32 64,128,32 32,64,64 lowered",
                    help="GEMM tile shapes M,N,K to compare, space-separated; `lowered` "
                         "(or lowered@M,N,K): the model's layers lowered from the IR")
    ap.add_argument("--warps", type=lambda s: [int(v) for v in s.split(",")], default=[4, 8])
    ap.add_argument("--per-sm", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2])
    ap.add_argument("--layers", type=int, default=HALF_STEPS)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--timeout", type=int, default=150, help="seconds a variant may take")
    ap.add_argument("--out")
    ap.add_argument("--tile", help=argparse.SUPPRESS)        # a child's variant
    args = ap.parse_args()
    if args.tile:
        child(args)
        return
    rows = []
    for tile in ["graph"] + args.tiles.split():
        cmd = [sys.executable, __file__, "--tile", tile, "--layers", str(args.layers),
               "--reps", str(args.reps), "--sessions", ",".join(map(str, args.sessions)),
               "--warps", ",".join(map(str, args.warps)),
               "--per-sm", ",".join(map(str, args.per_sm))]
        shape = tile.partition("@")[2] or tile       # lowered@M,N,K: the lowering's tiles
        env = dict(os.environ, WAVE_WPK_GEMM_TILE=shape if "," in shape else "64,64,32")
        print(f"[stage2] {tile} ...", flush=True)
        rows += child_rows(cmd, args.timeout, {"variant": f"task table {tile}", "tile": tile},
                           env)
    print(f"{'variant':26s} {'rows':>5s} {'warps':>5s} {'progs':>6s} {'regs':>5s} {'ms':>8s} "
          f"{'TB/s':>6s} {'rel err':>8s}")
    for r in rows:
        if "error" in r or "skipped" in r:
            print(f"{r['variant']:26s} {r.get('rows', ''):>5} {r.get('warps', ''):>5}  "
                  f"{(r.get('error') or r.get('skipped'))[-200:]!r}")
            continue
        print(f"{r['variant']:26s} {r['rows']:5d} {r.get('warps', ''):>5} "
              f"{r.get('programs', ''):>6} {r.get('registers', ''):>5} {r['ms']:8.3f} "
              f"{r['weight_tb_s']:6.2f} "
              f"{r.get('worst_rel_err', r.get('rel_err_vs_fp32_model', 0)):8.1e}")
    if args.out:
        doc = {"bench": "stage2_device", "date": datetime.datetime.now(datetime.timezone.utc)
               .strftime("%Y-%m-%dT%H:%M:%SZ"),
               "commit": os.environ.get("WAVE_COMMIT", "unknown"),
               "command": "python bench/stage2_device.py " + " ".join(sys.argv[1:]),
               "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "python": platform.python_version(),
               "half_steps": args.layers, "d_model": D, "hidden": HIDDEN, "rows": rows}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
