"""Mamba2 decode step (gpu/kernels/mamba_step.py) at the thinker's full shapes: launch-shape
variants of the SSM launch (state tile rows, tiles per program, warps, streaming hints) timed as
CUDA-graph replays (mean of --reps), against the bytes floor of its state traffic. Every variant's outputs and
state must equal the default's bit for bit (same arithmetic, other launch shape).

    python3 bench/mamba_tiles.py [--batch 120] [--out bench/results/mamba-tiles-h200.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.attn_layout import time_graph                               # noqa: E402
from gpu.kernels.mamba_step import mamba_step                          # noqa: E402

VARIANTS = [dict(block_p=16, tiles=1, num_warps=4), dict(block_p=16, tiles=5, num_warps=4),
            dict(block_p=16, tiles=5, num_warps=8), dict(block_p=8, tiles=10, num_warps=4),
            dict(block_p=32, tiles=3, num_warps=8), dict(block_p=16, tiles=5, num_warps=4, stream=True),
            dict(block_p=16, tiles=2, num_warps=4)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=120)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    dev, B = torch.device("cuda"), args.batch
    H, P, N, G = 128, 80, 128, 8
    d_inner, conv_dim = H * P, H * P + 2 * G * N
    g = torch.Generator(device=dev).manual_seed(0)
    rn = lambda *s, dt=torch.float32: torch.randn(*s, generator=g, device=dev).to(dt)   # noqa: E731
    w = dict(conv_w=rn(conv_dim, 4, dt=torch.bfloat16), conv_b=rn(conv_dim, dt=torch.bfloat16),
             dt_bias=rn(H), A_log=rn(H).abs(), D=rn(H), norm_w=rn(d_inner, dt=torch.bfloat16))
    xbc, z, dt = rn(B, conv_dim, dt=torch.bfloat16), rn(B, d_inner, dt=torch.bfloat16), rn(B, H, dt=torch.bfloat16)
    slots = torch.randperm(B + 1, device=dev)[:B].to(torch.int32)
    conv0, ssm0 = rn(B + 1, conv_dim, 3, dt=torch.bfloat16), rn(B + 1, H, P, N)
    floor_bytes = 2 * B * H * P * N * 4
    rows, first = [], None
    for v in VARIANTS:
        conv, ssm = conv0.clone(), ssm0.clone()
        call = lambda: mamba_step(xbc, z, dt, conv, ssm, slots, w["conv_w"], w["conv_b"], w["dt_bias"],  # noqa: E731
                                  w["A_log"], w["D"], w["norm_w"], ngroups=G, **v)
        y = call()
        if first is None:
            first = (y.clone(), conv.clone(), ssm.clone())
        same = all(torch.equal(a, b) for a, b in zip(first, (y, conv, ssm)))
        us = time_graph(call, args.reps) * 1e3
        rows.append(dict(v, us=round(us, 1), tb_s=round(floor_bytes / us / 1e6, 2), equal=same))
        print(rows[-1], flush=True)
    res = {"command": "python3 bench/mamba_tiles.py " + " ".join(sys.argv[1:]), "batch": B,
           "gpu": torch.cuda.get_device_name(0), "floor_bytes": floor_bytes,
           "note": "one layer's mamba_step (conv + SSM + group norm launches); tb_s = state bytes / time",
           "variants": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
