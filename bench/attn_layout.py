"""Why the talker's decode attention runs at ~2.9 TB/s inside the model but ~4 TB/s alone.

Times the 56 attention calls of one talker frame (28 layers × 2 CFG rows, fp32 KV, 1537
positions per session) as one CUDA graph, over caches laid out as:
  small        a fresh [B, H, P, D] cache per call site reused by all 56 calls (the kernel bench)
  slot-major   the engine's [S, L, R, H, P, D] arena, each call on its own (layer, row)
  layer-major  the same arena as [L, R, S, H, P, D]: one call's reads share fewer, denser pages
and prints µs per call and TB/s for each, with a few launch shapes.

    python3 bench/attn_layout.py --slots 97 --batch 64,96 [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu.kernels.decode_attention import decode_attention  # noqa: E402

L, R, H, D = 28, 2, 16, 72


def time_graph(fn, reps: int = 10) -> float:
    """Mean ms of one replay of `fn` captured as a graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(reps):
        g.replay()
    t1.record()
    torch.cuda.synchronize()
    return t0.elapsed_time(t1) / reps


def model_path(args, arena_k, arena_v) -> list[dict]:
    """The engine's own call (decode_ops.talker_attention: both CFG rows in one launch) over the
    arena as a TalkerState-shaped [S, L, R, H, P, D] cache, with P as allocated and the lengths
    the model has (P larger than the length, as in the engine and graph_stages)."""
    from gpu.engine.decode_ops import TritonDecodeOps
    ops, dev, out = TritonDecodeOps(), arena_k.device, []
    for P in (args.length + 3, args.length + 500):
        S = arena_k.numel() // (L * R * H * P * D)
        k = arena_k[:S * L * R * H * P * D].view(S, L, R, H, P, D)
        v = arena_v[:S * L * R * H * P * D].view(S, L, R, H, P, D)
        for B in map(int, args.batch.split(",")):
            slots = torch.arange(B, device=dev)
            pos = torch.full((B, 1), args.length - 1, device=dev)
            q = torch.randn(B, R, 1, H, D, device=dev)

            def frame():
                for l in range(L):
                    ops.talker_attention(q, k[:, l], v[:, l], slots, pos,
                                         7500 if (l + 1) % 6 else None, 256 ** -0.5)
            ms = time_graph(frame)
            bytes_frame = 2 * B * R * H * args.length * D * 4 * L
            row = {"batch": B, "layout": f"engine call, P={P}", "shape": {},
                   "ms_frame": round(ms, 3), "us_call": round(ms * 1e3 / (L * R), 1),
                   "tbps": round(bytes_frame / (ms * 1e-3) / 1e12, 2)}
            out.append(row)
            print(json.dumps(row), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, default=97)
    ap.add_argument("--batch", default="64,96")
    ap.add_argument("--length", type=int, default=1537)
    ap.add_argument("--out")
    args = ap.parse_args()
    dev = torch.device("cuda")
    S, P, n = args.slots, args.length + 3, args.length
    arena_k = torch.empty(S * L * R * H * P * D, device=dev).normal_()
    arena_v = torch.empty_like(arena_k).normal_()
    rows = []
    for B in map(int, args.batch.split(",")):
        slots = torch.arange(B, device=dev, dtype=torch.int32)
        lens = torch.full((B,), n, device=dev, dtype=torch.int32)
        q = torch.randn(B, H, D, device=dev)
        out = torch.empty_like(q)
        bytes_call = 2 * B * H * n * D * 4
        small_k = torch.randn(B, H, P, D, device=dev)
        small_v = torch.randn_like(small_k)
        layouts = {
            "small": lambda l, r: (small_k, small_v),
            "slot-major": lambda l, r: (arena_k.view(S, L, R, H, P, D)[:, l, r],
                                        arena_v.view(S, L, R, H, P, D)[:, l, r]),
            "layer-major": lambda l, r: (arena_k.view(L, R, S, H, P, D)[l, r],
                                         arena_v.view(L, R, S, H, P, D)[l, r]),
        }
        for name, views in layouts.items():
            for shape in ({}, {"block_l": 128}):
                def frame():
                    for l in range(L):
                        for r in range(R):
                            k, v = views(l, r)
                            decode_attention(q, k, v, slots, lens, scale=256 ** -0.5,
                                             window=7500 if (l + 1) % 6 else 0, out=out,
                                             max_len=n, **shape)
                ms = time_graph(frame)
                row = {"batch": B, "layout": name, "shape": shape, "ms_frame": round(ms, 3),
                       "us_call": round(ms * 1e3 / (L * R), 1),
                       "tbps": round(bytes_call * L * R / (ms * 1e-3) / 1e12, 2)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    rows += model_path(args, arena_k, arena_v)
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "slots": S,
                                              "length": n, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
