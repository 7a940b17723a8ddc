"""The talker's MHA decode attention (head_dim 72 as 64 + 8) with the per-lane online softmax
(lanes=True) against the split kernel (lanes=False), at talker shapes: bf16 KV with one CFG row
('dense') and fp32 KV with two ('reference'), 16 heads, 1537 positions (positions 1536 with
length_bias 1), scale 1/16, no window. Each variant is timed as a CUDA-graph replay (mean of
--reps), checked against decode_attention_ref (max abs err / max abs ref), and reported as TB/s
of its K/V bytes; registers and spills of the compiled attention kernel come along, since the
lanes kernel holds BLOCK_L x 72 fp32 accumulators.

    python3 bench/attn_lanes.py [--batch 128,256,300] [--out bench/results/attn-lanes-h200.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpu.kernels.decode_attention as attn                             # noqa: E402
from bench.attn_layout import time_graph                               # noqa: E402
from gpu.kernels.decode_attention import decode_attention, decode_attention_ref  # noqa: E402

H, P, D, POS = 16, 1540, 72, 1536
DEV = "cuda"
PROFILES = {"dense": (torch.bfloat16, 1), "reference": (torch.float32, 2)}
VARIANTS = [dict(lanes=False), dict(lanes=True, block_l=32), dict(lanes=True, block_l=64),
            dict(lanes=True, block_l=64, num_warps=8), dict(lanes=True, block_l=128, num_warps=8)]
COMPILED: dict[str, object] = {}        # kernel name -> the CompiledKernel of its last launch


class _Keep:
    """Launches a kernel as it is and keeps the CompiledKernel the launch returns."""
    def __init__(self, name):
        self.name, self.kernel = name, getattr(attn, name)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            COMPILED[self.name] = self.kernel[grid](*args, **kwargs)
            return COMPILED[self.name]
        return launch


def kernel_info(name: str) -> dict:
    k = COMPILED.get(name)
    if k is None:
        return {}
    ttgir = getattr(k, "asm", {}).get("ttgir", "") or ""
    return dict(kernel=name, n_regs=getattr(k, "n_regs", None), n_spills=getattr(k, "n_spills", None),
                shared=getattr(getattr(k, "metadata", None), "shared", None),
                convert_layouts=ttgir.count("convert_layout"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="128,256,300")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="bench/results/attn-lanes-h200.json")
    args = ap.parse_args()
    dev = torch.device(DEV)
    for name in ("_attn_mha_lanes_kernel", "_attn_mha_split_kernel"):
        setattr(attn, name, _Keep(name))
    torch.manual_seed(0)
    rows = []
    for B in map(int, args.batch.split(",")):
        for profile, (kv_dtype, R) in PROFILES.items():
            k = torch.randn(B, R, H, P, D, device=dev).to(kv_dtype)
            v = torch.randn(B, R, H, P, D, device=dev).to(kv_dtype)
            q = torch.randn(B, R, H, D, device=dev)
            slots = torch.randperm(B, device=dev)                       # int64, as the talker's
            pos = torch.full((B,), POS, device=dev, dtype=torch.int64)
            kw = dict(scale=1 / 16, window=0, length_bias=1)
            ref = decode_attention_ref(q, k, v, slots, pos, **kw)
            out = torch.empty_like(q)
            nbytes = B * R * H * (POS + 1) * D * k.element_size() * 2
            for var in VARIANTS:
                COMPILED.clear()
                o = decode_attention(q, k, v, slots, pos, out=out, **kw, **var)
                torch.cuda.synchronize()
                err = ((o - ref).abs().max() / ref.abs().max()).item()
                name = "_attn_mha_lanes_kernel" if var["lanes"] else "_attn_mha_split_kernel"
                info = kernel_info(name)
                us = time_graph(lambda: decode_attention(q, k, v, slots, pos, out=out, **kw, **var),
                                args.reps) * 1e3
                row = dict(batch=B, profile=profile, kv_dtype=str(kv_dtype).replace("torch.", ""),
                           rows=R, variant=var, us=round(us, 1), floor_bytes=nbytes,
                           tb_s=round(nbytes / (us * 1e-6) / 1e12, 3), rel_max_err=err, **info)
                rows.append(row)
                print(f"B={B:4d} {profile:9s} {row['kv_dtype']:8s} {str(var):55s} {us:8.1f} us "
                      f"{row['tb_s']:6.3f} TB/s  err {err:.2e}  regs {info.get('n_regs')} "
                      f"spills {info.get('n_spills')} cvt {info.get('convert_layouts')}", flush=True)
            k = v = ref = None                                          # free before the next
            torch.cuda.empty_cache()
    res = {"command": "python3 bench/attn_lanes.py " + " ".join(sys.argv[1:]),
           "torch": torch.__version__, "triton": triton.__version__,
           "gpu": torch.cuda.get_device_name(0),
           "note": "one layer's decode_attention (attention + combine launches); tb_s = K/V bytes / time",
           "rows": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
