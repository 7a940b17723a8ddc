"""A/B of perception's streaming attention at the model's shapes (MODEL.md §2.2: 8 heads x 128,
ring of 72 rows, left context 70, the beat's 2 frames a step), one layer, bf16:
  ref     relpos_attention_ref: the reference path from the ring gather to the output heads
          (index_select of both rings, bias adds, three products, the distance gather, mask,
          softmax), as RelPosAttention.stream runs it without the engine's hook;
  kernel  relpos_attention (gpu/kernels/relpos_attention.py), at 8, 4 and 2 warps.
Each is captured in a CUDA graph (mean of --reps replays); diff = max relative |out - ref|.
Rows' frames are spread over a ring's worth of positions, as a live node's are.

    python3 bench/relpos_ab.py [--batch 120,256,300] [--out bench/results/relpos-ab-h200.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.attn_layout import time_graph                                # noqa: E402
from gpu.kernels.relpos_attention import relpos_attention, relpos_attention_ref  # noqa: E402

HEADS, HEAD_DIM, RING, LEFT, FRAMES = 8, 128, 72, 70, 2
VARIANTS = [("ref", relpos_attention_ref, {}), ("kernel w8", relpos_attention, dict(num_warps=8)),
            ("kernel w4", relpos_attention, dict(num_warps=4)),
            ("kernel w2", relpos_attention, dict(num_warps=2))]


def inputs(batch: int, dev: torch.device, dtype=torch.bfloat16):
    g = torch.Generator(device=dev).manual_seed(batch)
    r = lambda *shape: torch.randn(*shape, device=dev, generator=g).to(dtype)   # noqa: E731
    slots = torch.randperm(batch + 1, device=dev, generator=g)[:batch]
    frames = torch.randint(0, 4000, (batch,), device=dev, generator=g)
    return (r(batch, FRAMES, HEADS, HEAD_DIM), r(batch + 1, HEADS, RING, HEAD_DIM),
            r(batch + 1, HEADS, RING, HEAD_DIM), slots, frames, r(RING, HEADS, HEAD_DIM),
            r(HEADS, HEAD_DIM), r(HEADS, HEAD_DIM))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="120,256,300", help="comma-separated batch sizes")
    ap.add_argument("--reps", type=int, default=50, help="graph replays timed per variant")
    ap.add_argument("--out", default="bench/results/relpos-ab-h200.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    for batch in map(int, args.batch.split(",")):
        args_ = inputs(batch, dev)
        kw = dict(left_context=LEFT, scale=HEAD_DIM ** -0.5)
        ref = relpos_attention_ref(*args_, **kw).float()
        nbytes = 2 * batch * HEADS * RING * HEAD_DIM * 2          # both rings' rows, once
        for label, fn, extra in VARIANTS:
            out = fn(*args_, **kw, **extra)
            diff = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            us = time_graph(lambda: fn(*args_, **kw, **extra), args.reps) * 1e3
            rows.append(dict(batch=batch, variant=label, us=round(us, 2), ring_bytes=nbytes,
                             tb_s=round(nbytes / us / 1e6, 3), diff=diff))
            print(f"B={batch:4d} {label:10s} {us:9.2f} µs/layer  rings {nbytes / 1e6:6.1f} MB "
                  f"{nbytes / us / 1e6:5.2f} TB/s  diff {diff:.1e}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(command="python3 bench/relpos_ab.py " + " ".join(sys.argv[1:]),
                                              gpu=torch.cuda.get_device_name(0), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
