"""A/B of two small bandwidth-bound kernels, first version against the new one, at the model's shapes:
  conv   mamba_conv (the conv launch of mamba_step): conv_dim 12288, bf16 xBC/state/weights; one
         call (the model makes 27 a frame). old = column loads (tiles=False), new = [block_c, 4] tiles.
  dwln   dwconv_ln (depthwise conv k7 + LayerNorm + the cache launch) at the codec's three (C, T),
         cache as the engine's [S, C, 6] transposed, int64 slots. old = window=False, new = rows window.
Each variant is captured in a CUDA graph (mean of --reps replays) and run once from the same inputs
as the first ("old") row: diff = max |out - old out|, state_diff the same over the state (should be 0).

    python3 bench/small_kernels_ab.py [--batch 128,256,300] [--out bench/results/small-kernels-ab-h200.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.attn_layout import time_graph                               # noqa: E402
from gpu.kernels.convnext_step import dwconv_ln                        # noqa: E402
from gpu.kernels.mamba_step import mamba_conv                          # noqa: E402

CONV_DIM = 12288
CODEC = ((1536, 9), (768, 63), (384, 441))                             # (C, T) of the 9 blocks, 3 each
CONV_VARIANTS = [("old", dict(tiles=False)), ("new", {}), ("new b256", dict(block_c=256)),
                 ("new b1024", dict(block_c=1024)), ("new b1024 w8", dict(block_c=1024, num_warps=8))]
DWLN_VARIANTS = [("old", dict(window=False)), ("new", {}), ("new rows4", dict(rows=4)),
                 ("new rows16", dict(rows=16))]


def ab(name, shape, variants, make_call, state0, nbytes, reps):
    """make_call(state, kw) -> a no-argument call returning its output; state0 cloned per run."""
    rows, first = [], None
    for label, kw in variants:
        state = state0.clone()
        out = make_call(state, kw)().clone()
        if first is None:
            first = (out, state.clone())
        diff = (out.float() - first[0].float()).abs().max().item()
        sdiff = (state.float() - first[1].float()).abs().max().item()
        us = time_graph(make_call(state, kw), reps) * 1e3
        rows.append(dict(kernel=name, shape=shape, variant=label, kw=kw, us=round(us, 2), bytes=nbytes,
                         tb_s=round(nbytes / us / 1e6, 3), diff=diff, state_diff=sdiff))
        r = rows[-1]
        print(f"{name:5s} {shape:22s} {label:13s} {r['us']:9.2f} µs {nbytes / 1e6:8.1f} MB "
              f"{r['tb_s']:6.2f} TB/s  diff {diff:.2e}  state {sdiff:.1e}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="128,256,300", help="comma-separated batch sizes")
    ap.add_argument("--reps", type=int, default=50, help="graph replays timed per variant")
    ap.add_argument("--out", default="bench/results/small-kernels-ab-h200.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    rn = lambda *s, dt=torch.float32: torch.randn(*s, generator=g, device=dev).to(dt)   # noqa: E731
    bf = torch.bfloat16
    rows = []
    for B in map(int, args.batch.split(",")):
        S = B + 7                                               # slots scattered over a larger arena
        perm = torch.randperm(S, generator=torch.Generator().manual_seed(B))[:B].to(dev)
        w, b = rn(CONV_DIM, 4, dt=bf), rn(CONV_DIM, dt=bf)
        xbc, out = rn(B, CONV_DIM, dt=bf), torch.empty(B, CONV_DIM, device=dev)
        slots = perm.to(torch.int32)
        conv_call = lambda st, kw: (lambda: mamba_conv(xbc, st, slots, w, b, out=out, **kw))  # noqa: E731
        rows += ab("conv", f"B={B} D={CONV_DIM}", CONV_VARIANTS, conv_call, rn(S, CONV_DIM, 3, dt=bf),
                   B * CONV_DIM * (2 + 6 + 6 + 4), args.reps)
        for C, T in CODEC:
            p = [rn(C, 7) / 7 ** 0.5, 0.1 * rn(C), 1 + 0.1 * rn(C), 0.1 * rn(C)]
            x, idx = rn(B, T, C), perm.to(torch.int64)
            dw_call = lambda st, kw: (lambda: dwconv_ln(x, st.transpose(1, 2), idx, *p, **kw))  # noqa: E731
            rows += ab("dwln", f"B={B} C={C} T={T}", DWLN_VARIANTS, dw_call, rn(S, C, 6),
                       2 * B * T * C * 4 + 12 * C * 4 * B, args.reps)
    res = {"command": "python3 bench/small_kernels_ab.py " + " ".join(sys.argv[1:]),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda,
           "note": "µs per call (CUDA graph replay mean); bytes: conv B·D·(2 xBC + 6+6 state + 4 out), "
                   "dwln 8·B·T·C + 48·B·C (as bench/kernels_device.py); diff/state_diff vs the 'old' row",
           "rows": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
        print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
