"""`python bench/stage0_device.py --out bench/results/stage0-h200.json`: issue 18's stage 0 on a GPU,
inside CUDA graphs (how the engine runs them):

- the talker's RVQ for one frame (schedule widths 1, 1, 3, 4, 22 over 31 codebooks of 1024 × 512):
  the model's PyTorch loop (5 small launches a codebook), the Triton search as a launch per
  step, and as one chained launch per width (grid barriers between steps) under several tile
  shapes. Codes are counted against an fp64 search; the chain against the launch-per-step form
  with the same tiles must be bit-equal (same body, same sums).
- programmatic dependent launch (PDL): a chain of small dependent Triton kernels, each launched
  plain or with PDL (the next kernel's launch overlaps the previous one's tail; it waits in
  `gdc_wait` before reading), the time a kernel.

Prints a table and writes the JSON.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gpu.kernels.rvq_search import rvq_search, rvq_search_ref, rvq_sqnorm  # noqa: E402
from gpu.model.talker_mog import rvq_search as model_rvq  # noqa: E402

SCHEDULE = (1, 1, 3, 4, 22)


def graph_ms(fn, reps: int = 100) -> float:
    """Median ms of one replay of `fn` captured in a CUDA graph."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(10):
        g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def rvq_frame(kind: str, z, books, sqn, blocks: dict | None = None):
    """One frame's searches, each width from z as the talker's steps do (every step has its own
    latent); returns fn() → codes [B, 31]."""
    def fn():
        codes, first = [], 0
        for w in SCHEDULE:
            if kind == "torch":
                c, _ = model_rvq(z, books[first:first + w], sqn[first:first + w])
            elif kind == "fp64":
                c, _, _ = rvq_search_ref(z.clone(), torch.zeros_like(z), books, sqn, first, w)
            else:
                r, q = z.clone(), torch.zeros_like(z)
                c, _, _ = rvq_search(r, q, books, sqn, first, w, precision="tf32x3",
                                     chain=kind == "chain", **(blocks or {}))
            codes.append(c)
            first += w
        return torch.cat(codes, -1)
    return fn


def rvq_rows(batches, configs) -> list[dict]:
    torch.backends.cuda.matmul.allow_tf32 = True            # the talker's profile
    rows = []
    for batch in batches:
        g = torch.Generator(device="cuda").manual_seed(batch)
        books = torch.randn(31, 1024, 512, device="cuda", generator=g)
        sqn = rvq_sqnorm(books)
        z = torch.randn(batch, 512, device="cuda", generator=g) * 3.0
        ref = rvq_frame("fp64", z.double(), books.double(), sqn.double())()
        variants = [("torch", {}), ("steps", {})] + [("chain", c) for c in configs]
        variants += [("steps", c) for c in configs]
        seen = {}
        for kind, blocks in variants:
            short = {"block_b": "b", "block_n": "n", "num_warps": "w"}
            name = kind + "".join(f" {short[k]}{v}" for k, v in blocks.items())
            row = {"batch": batch, "variant": name}
            try:
                fn = rvq_frame(kind, z, books, sqn, blocks)
                codes = fn()
                torch.cuda.synchronize()
                row["mismatch_vs_fp64"] = int((codes.long() != ref.long()).sum())
                row["ms_frame"] = round(graph_ms(fn), 4)
                key = tuple(sorted(blocks.items()))
                if kind in ("steps", "chain") and key in seen:
                    row["equals_steps_same_tiles"] = bool(torch.equal(seen[key], codes))
                seen.setdefault(key, codes)
            except Exception as exc:                       # a tile shape that cannot run
                row["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            rows.append(row)
            print(row, flush=True)
    return rows


@triton.jit
def _hop(X, Y, n, PDL: tl.constexpr, BLOCK: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()                 # the previous kernel's writes are visible
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + i, mask=i < n)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()    # let the next kernel's launch start now
    tl.store(Y + i, x * 1.0001 + 1.0, mask=i < n)


def pdl_rows(kernels: int, sizes) -> list[dict]:
    rows = []
    for n in sizes:
        bufs = [torch.zeros(n, device="cuda"), torch.zeros(n, device="cuda")]
        block = 1024
        grid = (triton.cdiv(n, block),)
        out = {}
        for pdl in (False, True):
            def fn():
                for k in range(kernels):
                    _hop[grid](bufs[k % 2], bufs[(k + 1) % 2], n, PDL=pdl, BLOCK=block,
                               launch_pdl=pdl)
            bufs[0].zero_()
            ms = graph_ms(fn)
            bufs[0].zero_()
            bufs[1].zero_()
            fn()
            torch.cuda.synchronize()
            out[pdl] = bufs[kernels % 2].clone()
            rows.append({"elements": n, "kernels": kernels, "pdl": pdl,
                         "us_per_kernel": round(1000 * ms / kernels, 3)})
            print(rows[-1], flush=True)
        rows[-1]["equal_to_plain"] = bool(torch.equal(out[False], out[True]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="120,300")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    configs = [dict(block_b=16, block_n=64), dict(block_b=16, block_n=128),
               dict(block_b=32, block_n=64), dict(block_b=32, block_n=128),
               dict(block_b=16, block_n=64, num_warps=8), dict(block_b=64, block_n=64),
               dict(block_b=16, block_n=32), dict(block_b=32, block_n=32)]
    batches = [int(b) for b in args.batches.split(",")]
    result = {"command": " ".join(["python", "bench/stage0_device.py"] + sys.argv[1:]),
              "commit": os.environ.get("WAVE_COMMIT", "unknown"),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "python": platform.python_version(),
              "sms": torch.cuda.get_device_properties(0).multi_processor_count,
              "rvq": rvq_rows(batches, configs), "pdl": pdl_rows(256, (4096, 262144))}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
