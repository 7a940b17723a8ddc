"""Codec ConvNeXt pointwise tail, torch vs fused: (a) F.gelu(u) + addmm(b2, g, W2ᵀ) + add_(x)
(TF32 matmul) against (b) gelu_linear_residual(u, W2, b2, x, out) (gpu/kernels/convnext_step.py)
in a few launch shapes, each as a CUDA graph (mean of --reps replays), at the codec's three stage
shapes (C, T) = (1536, 9), (768, 63), (384, 441), M = B·T rows, K = 4C, N = C. Each fused variant
is checked against the torch path (relative norm error) and both against fp64 on the first rows.
Per frame: 3 ConvNeXt blocks per stage (CodecConfig.n_blocks), 9 calls.

    python3 bench/codec_pointwise_ab.py [--batch 128,256,300] [--out bench/results/codec-pointwise-ab-h200.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.attn_layout import time_graph                                            # noqa: E402
from gpu.kernels.convnext_step import gelu_linear_residual, gelu_linear_residual_ref  # noqa: E402

SHAPES = [(1536, 9), (768, 63), (384, 441)]
BLOCKS_PER_STAGE = 3
VARIANTS = [dict(block_m=128, block_n=128, block_k=32, num_warps=8, num_stages=3),
            dict(block_m=128, block_n=64, block_k=32, num_warps=4, num_stages=4),
            dict(block_m=64, block_n=128, block_k=32, num_warps=4, num_stages=4),
            dict(block_m=128, block_n=256, block_k=32, num_warps=8, num_stages=3)]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="128,256,300")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--check-rows", type=int, default=4096, help="rows compared against fp64")
    ap.add_argument("--out", default="bench/results/codec-pointwise-ab-h200.json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    dev, rows = torch.device("cuda"), []
    g = torch.Generator(device=dev).manual_seed(0)
    for B in map(int, args.batch.split(",")):
        frame = {"torch": 0.0} | {f"v{i}": 0.0 for i in range(len(VARIANTS))}
        for C, T in SHAPES:
            M, K, N = B * T, 4 * C, C
            u = 1.5 * torch.randn(M, K, generator=g, device=dev)
            w2 = torch.randn(N, K, generator=g, device=dev) / K ** 0.5
            b2, x = 0.1 * torch.randn(N, generator=g, device=dev), torch.randn(M, N, generator=g, device=dev)
            out_t, out_f = torch.empty_like(x), torch.empty_like(x)
            r = min(M, args.check_rows)
            ref = gelu_linear_residual_ref(u[:r].double(), w2.double(), b2.double(), x[:r].double())

            def torch_path():
                torch.addmm(b2, F.gelu(u), w2.t(), out=out_t).add_(x)
            torch_path()
            us_t = time_graph(torch_path, args.reps) * 1e3
            row = dict(B=B, C=C, T=T, M=M, K=K, N=N, torch_us=round(us_t, 1),
                       torch_rel_fp64=rel(out_t[:r], ref), variants=[])
            frame["torch"] += BLOCKS_PER_STAGE * us_t
            for i, v in enumerate(VARIANTS):
                try:
                    fused = lambda v=v: gelu_linear_residual(u, w2, b2, x, out_f, **v)  # noqa: E731
                    out_f.fill_(float("nan"))
                    fused()
                    torch.cuda.synchronize()
                    err, err64 = rel(out_f, out_t), rel(out_f[:r], ref)
                    us = time_graph(fused, args.reps) * 1e3
                    row["variants"].append(dict(v, us=round(us, 1), rel_vs_torch=err, rel_fp64=err64,
                                                tflops=round(2 * M * K * N / us / 1e6, 1),
                                                ok=bool(err < 5e-3 and err64 < 5e-3)))
                    frame[f"v{i}"] += BLOCKS_PER_STAGE * us
                except Exception as e:                     # e.g. out of shared memory: record, go on
                    row["variants"].append(dict(v, error=f"{type(e).__name__}: {str(e)[:200]}"))
                    frame[f"v{i}"] = float("nan")
            print(json.dumps(row), flush=True)
            rows.append(row)
            torch.cuda.empty_cache()
        frame = {k: round(t, 1) for k, t in frame.items()}
        print(f"B={B} per frame ({BLOCKS_PER_STAGE * len(SHAPES)} calls), µs: {frame}", flush=True)
        rows.append(dict(B=B, frame_us=frame))
    import triton
    res = {"command": "python3 bench/codec_pointwise_ab.py " + " ".join(sys.argv[1:]),
           "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(0), "reps": args.reps, "variants": VARIANTS,
           "note": "µs per call, CUDA-graph replay; frame_us = 3 blocks x 3 stages; v<i> = VARIANTS[i]",
           "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
