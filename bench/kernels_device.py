#!/usr/bin/env python3
"""Device check and timing of the wave kernels (gpu/kernels/*) at full model shapes.

Per kernel and batch size: fresh random inputs (never zeros) in several sets that differ in slots
and data, rotated between timed calls; correctness of set 0 against the `_ref` twin run on fp64
copies (relative-norm error, or index mismatches); graph replay checked bit-equal to eager; the
kernel timed as CUDA-graph replays with triton.testing.do_bench (median), the `_ref` timed eagerly;
achieved bandwidth = bytes that must move / time, against 4.3 TB/s. Prints a table last and
writes JSON to $OUT/kernels-h200.json (and prints it). `--smoke` runs tiny shapes on the CPU
(Triton interpreter) to test this script itself.

    PYTHONUNBUFFERED=1 python3 bench/kernels_device.py [--smoke] [--budget SECONDS]
"""
from __future__ import annotations

import datetime
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SMOKE = "--smoke" in sys.argv
if not (Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402

from gpu.kernels.convnext_step import convnext_step, convnext_step_ref, dwconv_ln  # noqa: E402
from gpu.kernels.decode_attention import decode_attention, decode_attention_ref  # noqa: E402
from gpu.kernels.mamba_step import mamba_step, mamba_step_ref  # noqa: E402
from gpu.kernels.mog_sample import mog_sample, mog_sample_ref  # noqa: E402
from gpu.kernels.rvq_search import rvq_search, rvq_search_ref, rvq_sqnorm  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
BW = 4.3e12          # B/s, H200 copy bandwidth measured here (KINDS.md); re-measured below
TF32_RATE = 300e12   # FLOP/s, MODEL.md §5 roofline
BUDGET = float(sys.argv[sys.argv.index("--budget") + 1]) if "--budget" in sys.argv else 240.0
T0 = time.time()
ROWS: list[dict] = []
F64 = torch.float64


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def set_tf32(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def rn(*shape, dtype=torch.float32, scale=1.0):
    return (scale * torch.randn(*shape, device=DEV)).to(dtype)


def _median(fn) -> float:
    if not CUDA:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3


def time_graph(fns, snapshot=()) -> tuple[float, bool]:
    """Median seconds of CUDA-graph replays, rotating over fns (one per input set). Also checks
    that replaying set 0 equals running it eagerly, bit for bit, over the tensors in `snapshot`
    (outputs and states, restored between the two)."""
    for f in fns:
        f()                                           # compile + warm
    if not CUDA:
        return _median(fns[0]), True
    torch.cuda.synchronize()
    graphs = []
    for f in fns:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            f()
        graphs.append(g)
    same = True
    if snapshot:
        before = [t.clone() for t in snapshot]
        fns[0]()
        eager = [t.clone() for t in snapshot]
        for t, b in zip(snapshot, before):
            t.copy_(b)
        graphs[0].replay()
        torch.cuda.synchronize()
        same = all(torch.equal(t, e) for t, e in zip(snapshot, eager))
        del before, eager
    i = [0]

    def replay():
        graphs[i[0] % len(graphs)].replay()
        i[0] += 1
    t = _median(replay)
    del graphs
    return t, same


def time_eager(fns) -> float:
    fns[0]()
    i = [0]

    def call():
        fns[i[0] % len(fns)]()
        i[0] += 1
    return _median(call)


def record(kernel, case, batch, err_name, err, ok, t_k, t_ref, nbytes, flops=0.0, **extra):
    floor = max(nbytes / BW, flops / TF32_RATE)
    row = dict(kernel=kernel, case=case, B=batch, err_name=err_name, err=err, ok=bool(ok),
               t_kernel_us=t_k * 1e6, t_ref_us=(t_ref * 1e6 if t_ref else None), bytes=int(nbytes),
               flops=flops, floor_us=floor * 1e6, gbps=nbytes / t_k / 1e9,
               bw_frac=nbytes / t_k / BW, floor_frac=floor / t_k, **extra)
    ROWS.append(row)
    print(f"  {kernel:9s} {case:24s} B={batch:<4d} {err_name}={err:.2e} ok={ok} "
          f"t={t_k * 1e6:9.1f}us ref={row['t_ref_us'] or 0:9.1f}us {row['gbps']:7.0f} GB/s "
          f"({100 * row['bw_frac']:.0f}% of BW, {100 * row['floor_frac']:.0f}% of floor) {extra or ''}")


def over_budget() -> bool:
    return time.time() - T0 > BUDGET


def slot_sets(batch, nsets):
    return torch.randperm(batch * nsets, device=DEV).to(torch.int32).view(nsets, batch)


# ----------------------------------------------------------------------------------- mamba
def kw_name(kw) -> str:
    return " ".join(f"{k}={v}" for k, v in kw.items())


def bench_mamba(batch, nsets, variants=({},)):
    nh, hd, ds, ng = (6, 5, 6, 2) if SMOKE else (128, 80, 128, 8)
    d_inner, bf = nh * hd, torch.bfloat16
    conv_dim = d_inner + 2 * ng * ds
    n_slots = batch * nsets
    w = dict(conv_w=rn(conv_dim, 4, dtype=bf, scale=0.5), conv_b=rn(conv_dim, dtype=bf, scale=0.1),
             dt_bias=torch.log(torch.expm1(torch.exp(torch.empty(nh, device=DEV).uniform_(math.log(1e-3), math.log(1e-1))))),
             A_log=torch.log(torch.empty(nh, device=DEV).uniform_(1, 16)), D=1 + rn(nh, scale=0.2),
             norm_w=(1 + rn(d_inner, scale=0.1)).to(bf))
    w["dt_bias"][:2] = 33.5
    conv_state = rn(n_slots, conv_dim, 3, dtype=bf)
    ssm_state = rn(n_slots, nh, hd, ds)
    sets = [dict(xBC=rn(batch, conv_dim, dtype=bf), z=rn(batch, d_inner, dtype=bf), dt=rn(batch, nh, dtype=bf),
                 slots=s, out=torch.empty(batch, d_inner, device=DEV, dtype=bf)) for s in slot_sets(batch, nsets)]
    wargs = lambda d: (d["conv_w"], d["conv_b"], d["dt_bias"], d["A_log"], d["D"], d["norm_w"])
    nbytes = batch * (2 * nh * hd * ds * 4 + 2 * conv_dim * 3 * 2 + conv_dim * 2 + 2 * d_inner * 2 + nh * 2) \
        + conv_dim * 4 * 2 + conv_dim * 2 + d_inner * 2 + 3 * nh * 4
    for vi, kw in enumerate(variants):
        s0 = sets[0]
        idx = s0["slots"].long()
        cs64, ss64 = conv_state[idx].to(F64), ssm_state[idx].to(F64)
        y = mamba_step(s0["xBC"], s0["z"], s0["dt"], conv_state, ssm_state, s0["slots"], *wargs(w),
                       ngroups=ng, **kw)
        w64 = {k: v.to(F64) for k, v in w.items()}
        y64 = mamba_step_ref(s0["xBC"].to(F64), s0["z"].to(F64), s0["dt"].to(F64), cs64, ss64,
                             torch.arange(batch, device=DEV, dtype=torch.int32), *wargs(w64), ngroups=ng)
        e_y, e_s = rel(y, y64), rel(ssm_state[idx], ss64)
        conv_ok = torch.equal(conv_state[idx], cs64.to(bf))
        del cs64, ss64, y64
        fns = [lambda s=s: mamba_step(s["xBC"], s["z"], s["dt"], conv_state, ssm_state, s["slots"],
                                      *wargs(w), ngroups=ng, out=s["out"], **kw) for s in sets]
        t_k, same = time_graph(fns, snapshot=[sets[0]["out"], ssm_state, conv_state])
        t_ref = None
        if vi == 0:
            t_ref = time_eager([lambda s=s: mamba_step_ref(s["xBC"], s["z"], s["dt"], conv_state, ssm_state,
                                                           s["slots"], *wargs(w), ngroups=ng) for s in sets])
        ok = e_y < 1e-2 and e_s < 1e-5 and conv_ok and same
        record("mamba", f"bf16 {kw_name(kw)}", batch, "err_y|state", max(e_y, e_s), ok, t_k, t_ref, nbytes,
               err_y=e_y, err_state=e_s, conv_state_equal=conv_ok, graph_equals_eager=same)


# ------------------------------------------------------------------------------- attention
def bench_attention(case, batch, hq, hkv, hd, kv_dtype, q_dtype, window, nsets, variants=({},)):
    cap, lo, hi = (50, 30, 46) if SMOKE else (1600, 1400, 1538)
    scale = 1 / math.sqrt(128) if hq != hkv else 1 / math.sqrt(256)
    n_slots = batch * nsets
    k = rn(n_slots, hkv, cap, hd, dtype=kv_dtype)
    v = rn(n_slots, hkv, cap, hd, dtype=kv_dtype)
    sets = [dict(q=rn(batch, hq, hd, dtype=q_dtype), slots=s,
                 lens=torch.randint(lo, hi, (batch,), device=DEV, dtype=torch.int32),
                 out=torch.empty(batch, hq, hd, device=DEV, dtype=q_dtype)) for s in slot_sets(batch, nsets)]
    s0 = sets[0]
    idx = s0["slots"].long()
    o64 = decode_attention_ref(s0["q"].to(F64), k[idx].to(F64), v[idx].to(F64),
                               torch.arange(batch, device=DEV, dtype=torch.int32), s0["lens"],
                               scale=scale, window=window)
    lens = s0["lens"].long()
    span = (lens - (lens - window).clamp_min(0) if window else lens).sum().item()
    esz = torch.finfo(kv_dtype).bits // 8
    nbytes = 2 * span * hkv * hd * esz + 2 * batch * hq * hd * torch.finfo(q_dtype).bits // 8
    tol = 1e-2 if torch.bfloat16 in (kv_dtype, q_dtype) else 1e-5
    for vi, kw in enumerate(variants):
        o = decode_attention(s0["q"], k, v, s0["slots"], s0["lens"], scale=scale, window=window,
                             max_len=hi - 1, **kw)
        err = rel(o, o64)
        fns = [lambda s=s: decode_attention(s["q"], k, v, s["slots"], s["lens"], scale=scale, window=window,
                                            max_len=hi - 1, out=s["out"], **kw) for s in sets]
        t_k, same = time_graph(fns, snapshot=[sets[0]["out"]])
        t_ref = None
        if vi == 0:
            t_ref = time_eager([lambda s=s: decode_attention_ref(s["q"], k, v, s["slots"], s["lens"], scale=scale,
                                                                 window=window, max_len=hi - 1) for s in sets])
        record("attention", f"{case} {kw_name(kw)}".strip(), batch, "rel_err", err, err < tol and same, t_k,
               t_ref, nbytes, graph_equals_eager=same, mean_len=float(lens.float().mean()), window=window)


# ------------------------------------------------------------------------------------- MoG
def bench_mog(batch, nsets, variants=({},)):
    m = 1024
    sets = [dict(x=rn(batch, m, scale=2.0), u=torch.rand(batch, m, device=DEV),
                 out=torch.empty(batch, device=DEV, dtype=torch.int32)) for _ in range(nsets)]
    s0 = sets[0]
    ref32, ref64 = mog_sample_ref(s0["x"], s0["u"]), mog_sample_ref(s0["x"].to(F64), s0["u"].to(F64))
    for vi, kw in enumerate(variants):
        k = mog_sample(s0["x"], s0["u"], **kw)
        mism32, mism64 = int((k != ref32).sum()), int((k != ref64).sum())
        t_k, same = time_graph([lambda s=s: mog_sample(s["x"], s["u"], out=s["out"], **kw) for s in sets],
                               snapshot=[sets[0]["out"]])
        t_ref = time_eager([lambda s=s: mog_sample_ref(s["x"], s["u"]) for s in sets]) if vi == 0 else None
        record("mog", f"M=1024 {kw_name(kw)}".strip(), batch, "mismatch_fp32", float(mism32),
               mism32 == 0 and same, t_k, t_ref, batch * m * 8 + batch * 4, mismatch_vs_fp64=mism64,
               graph_equals_eager=same)


# ------------------------------------------------------------------------------------- RVQ
def bench_rvq(batch, nsets, j0, w, variants, books, sqn):
    dim = books.shape[2]
    sets = [dict(r=rn(batch, dim, scale=1.5), q=rn(batch, dim),
                 out=torch.empty(batch, w, device=DEV, dtype=torch.int32)) for _ in range(nsets)]
    nbytes = w * books.shape[1] * (dim + 1) * 4 + batch * dim * 4 * 4 + batch * w * 4
    flops = 2.0 * batch * w * books.shape[1] * dim
    for i, kw in enumerate(variants):
        s0 = sets[0]
        r64, q64 = s0["r"].to(F64), s0["q"].to(F64)
        codes, _, _ = rvq_search(s0["r"], s0["q"], books, sqn, j0, w, **kw)
        c64, _, _ = rvq_search_ref(r64, q64, books.to(F64), sqn.to(F64), j0, w)
        mism = int((codes != c64).sum())
        e_r, e_q = rel(s0["r"], r64), rel(s0["q"], q64)
        t_k, same = time_graph([lambda s=s: rvq_search(s["r"], s["q"], books, sqn, j0, w, out=s["out"], **kw)
                                for s in sets],
                               snapshot=[sets[0]["out"], sets[0]["r"], sets[0]["q"]])
        t_ref = None
        if i == 0:
            t_ref = time_eager([lambda s=s: rvq_search_ref(s["r"].clone(), s["q"].clone(), books, sqn, j0, w)
                                for s in sets])
        record("rvq", f"w={w} {kw_name(kw)}", batch, "code_mismatch", float(mism), mism == 0 and max(e_r, e_q) < 1e-4
               and same, t_k, t_ref, nbytes, flops, err_r=e_r, err_q=e_q, graph_equals_eager=same)


# -------------------------------------------------------------------------------- ConvNeXt
def bench_convnext(batch, n_c, n_t, nsets, variants=({},)):
    n_slots = batch * nsets
    p = dict(dw_w=rn(n_c, 7, scale=7 ** -0.5), dw_b=rn(n_c, scale=0.1), ln_w=1 + rn(n_c, scale=0.1),
             ln_b=rn(n_c, scale=0.1), pw1_w=rn(4 * n_c, n_c, scale=n_c ** -0.5), pw1_b=rn(4 * n_c, scale=0.1),
             pw2_w=rn(n_c, 4 * n_c, scale=(4 * n_c) ** -0.5), pw2_b=rn(n_c, scale=0.1))
    pa = lambda d: (d["dw_w"], d["dw_b"], d["ln_w"], d["ln_b"], d["pw1_w"], d["pw1_b"], d["pw2_w"], d["pw2_b"])
    cache = rn(n_slots, 6, n_c)
    sets = [dict(x=rn(batch, n_t, n_c), slots=s, out=torch.empty(batch, n_t, n_c, device=DEV))
            for s in slot_sets(batch, nsets)]
    s0 = sets[0]
    idx = s0["slots"].long()
    act = batch * n_t * n_c * 4
    nbytes = 2 * act + 8 * n_c * n_c * 4 + 12 * n_c * 4 * batch
    dw_bytes = 2 * act + 12 * n_c * 4 * batch
    flops = 16.0 * batch * n_t * n_c * n_c
    for vi, kw in enumerate(variants):
        errs = {}
        for tf32 in (False, True):
            set_tf32(tf32)
            c64 = cache[idx].to(F64)
            y = convnext_step(s0["x"], cache, s0["slots"], *pa(p), **kw)
            y64 = convnext_step_ref(s0["x"].to(F64), c64, torch.arange(batch, device=DEV, dtype=torch.int32),
                                    *pa({k: v.to(F64) for k, v in p.items()}))
            errs[tf32] = rel(y, y64)
            cache_ok = torch.equal(cache[idx], c64.float())
        set_tf32(True)                   # the reference profile: talker/codec matmuls in TF32
        t_k, same = time_graph([lambda s=s: convnext_step(s["x"], cache, s["slots"], *pa(p), out=s["out"], **kw)
                                for s in sets], snapshot=[sets[0]["out"], cache])
        t_dw, _ = time_graph([lambda s=s: dwconv_ln(s["x"], cache, s["slots"], *pa(p)[:4], **kw) for s in sets])
        t_ref = time_eager([lambda s=s: convnext_step_ref(s["x"], cache, s["slots"], *pa(p)) for s in sets]) \
            if vi == 0 else None
        set_tf32(False)
        ok = errs[False] < 1e-5 and errs[True] < 5e-3 and cache_ok and same
        record("convnext", f"C={n_c} T={n_t} tf32 {kw_name(kw)}".strip(), batch, "err_fp32|tf32", errs[False],
               ok, t_k, t_ref, nbytes, flops, err_tf32=errs[True], cache_equal=cache_ok, graph_equals_eager=same,
               dwconv_ln_us=t_dw * 1e6, dwconv_ln_bytes=dw_bytes, dwconv_ln_bw_frac=dw_bytes / t_dw / BW)


def measure_copy_bw() -> float:
    if not CUDA:
        return BW
    a = torch.empty(2 * 1024 ** 3 // 4, device=DEV).normal_()
    b = torch.empty_like(a)
    t = _median(lambda: b.copy_(a))
    del a, b
    return 2 * 2 * 1024 ** 3 / t


# {} is each launcher's default (split_d with BLOCK_L 64; algo "sort" with 8 warps); the others
# keep the alternatives measured beside it.
TALKER_VARIANTS = [{}, dict(block_l=32), dict(split_d=False)]
MOG_VARIANTS = [{}, dict(algo="pairwise")]


def full_jobs(bs, books, sqn):
    """(name, job): every kernel at its headline size first, then the rest."""
    jobs = []
    for i, b in enumerate(reversed(bs)):
        nsets = 2 if b >= 64 else 4
        jobs.append((i, f"mamba B={b}", lambda b=b, n=nsets: bench_mamba(b, n)))
        jobs.append((i, f"attn thinker B={b}", lambda b=b, n=nsets: bench_attention(
            "thinker gqa bf16", b, 40, 8, 128, torch.bfloat16, torch.bfloat16, 0, n)))
        jobs.append((i, f"attn talker B={b}", lambda b=b, n=nsets: bench_attention(
            "talker fp32", b, 16, 16, 72, torch.float32, torch.float32, 0, n, TALKER_VARIANTS)))
        jobs.append((i, f"rvq B={b}", lambda b=b: bench_rvq(
            b, 2, 9, 22, [{"precision": "tf32x3"}, {"precision": "ieee"}], books, sqn)))
        jobs.append((i, f"mog B={b}", lambda b=b: bench_mog(b, 2, MOG_VARIANTS)))
        for n_c, n_t in ([(24, 9)] if SMOKE else [(1536, 9), (768, 63), (384, 441)]):
            jobs.append((i, f"convnext C={n_c} B={b}",
                         lambda b=b, n_c=n_c, n_t=n_t: bench_convnext(b, n_c, n_t, 2)))
    if not SMOKE:
        jobs.append((1, "attn talker B=256", lambda: bench_attention(
            "talker fp32", 256, 16, 16, 72, torch.float32, torch.float32, 0, 2, TALKER_VARIANTS)))
    jobs.append((1, "attn talker window", lambda: bench_attention(
        "talker fp32 window=512", bs[-1], 16, 16, 72, torch.float32, torch.float32, 20 if SMOKE else 512, 2,
        TALKER_VARIANTS[:2])))
    jobs.append((1, "attn talker bf16", lambda: bench_attention(
        "talker dense bf16-KV", bs[-1], 16, 16, 72, torch.bfloat16, torch.float32, 0, 2, TALKER_VARIANTS)))
    jobs.append((1, "rvq w=1", lambda: bench_rvq(bs[-1], 2, 0, 1, [{"precision": "tf32x3"}], books, sqn)))
    return [(name, job) for _, name, job in sorted(jobs, key=lambda j: j[0])]


def sweep_jobs(bs, books, sqn):
    """Launch-shape variants (each checked too) at the largest and smallest batch."""
    big, small = bs[-1], bs[0]
    mam = [dict(block_p=16), dict(block_p=32), dict(block_p=16, num_warps=8), dict(block_p=32, num_warps=8),
           dict(block_p=16, stream=True), dict(block_p=32, num_warps=8, stream=True)]
    mha = [{}, dict(block_l=64), dict(block_l=64, num_warps=8), dict(block_l=16), dict(mha_dot=True, block_l=32),
           dict(mha_dot=True, block_l=64), dict(mha_dot=True, block_l=64, num_warps=8)]
    dense = [{}, dict(block_l=64), dict(mha_dot=True, block_l=32), dict(mha_dot=True, block_l=64, num_warps=8)]
    gqa = [{}, dict(block_l=32), dict(block_l=128, num_warps=8)]
    rvq = [dict(precision="tf32x3"), dict(precision="tf32x3", block_n=32), dict(precision="tf32x3", block_n=16),
           dict(precision="tf32x3", block_n=32, block_k=128), dict(precision="tf32x3", block_n=16, block_k=128),
           dict(precision="tf32x3", block_n=32, num_warps=2)]
    mog = [dict(items=32), dict(items=16, num_warps=4), dict(items=64), dict(items=32, num_warps=4)]
    cnx = [{}, dict(block_elems=2048, num_warps=4), dict(block_elems=1024, num_warps=4),
           dict(block_elems=2048, num_warps=8), dict(block_elems=1024, num_warps=2)]
    jobs = [("mamba", lambda: bench_mamba(big, 2, mam)),
            ("talker", lambda: bench_attention("talker fp32", big, 16, 16, 72, torch.float32, torch.float32, 0, 2, mha)),
            ("thinker", lambda: bench_attention("thinker gqa bf16", big, 40, 8, 128, torch.bfloat16, torch.bfloat16,
                                                0, 2, gqa)),
            ("dense", lambda: bench_attention("talker dense bf16-KV", big, 16, 16, 72, torch.bfloat16,
                                              torch.float32, 0, 2, dense)),
            ("rvq", lambda: bench_rvq(big, 2, 9, 22, rvq, books, sqn)),
            ("mog", lambda: bench_mog(big, 2, mog)),
            ("mog small", lambda: bench_mog(small, 2, mog))]
    for n_c, n_t in ([(24, 9)] if SMOKE else [(1536, 9), (384, 441)]):
        jobs.append((f"convnext {n_c}", lambda n_c=n_c, n_t=n_t: bench_convnext(big, n_c, n_t, 2, cnx)))
    jobs += [("thinker small", lambda: bench_attention(
                 "thinker gqa bf16", small, 40, 8, 128, torch.bfloat16, torch.bfloat16, 0, 4,
                 [{}, dict(num_splits=18), dict(num_splits=18, block_l=32), dict(num_splits=36, block_l=32)])),
             ("talker small", lambda: bench_attention(
                 "talker fp32", small, 16, 16, 72, torch.float32, torch.float32, 0, 4,
                 [{}, dict(num_splits=10), dict(num_splits=20, block_l=16), dict(num_splits=10, mha_dot=True)])),
             ("mamba small", lambda: bench_mamba(small, 4, mam))]
    return jobs


def main():
    torch.manual_seed(0)
    set_tf32(False)
    info = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                gpu=torch.cuda.get_device_name() if CUDA else "cpu (interpreter)",
                torch=torch.__version__, triton=triton.__version__, argv=sys.argv, bw_assumed=BW)
    if CUDA:
        info["copy_bw_measured"] = measure_copy_bw()
        print(f"device-to-device copy: {info['copy_bw_measured'] / 1e12:.2f} TB/s (read + write)")
    bs = [3] if SMOKE else [8, 64, 128]
    books = rn(31, 40 if SMOKE else 1024, 24 if SMOKE else 512)
    sqn = rvq_sqnorm(books)
    jobs = sweep_jobs(bs, books, sqn) if "--sweep" in sys.argv else full_jobs(bs, books, sqn)
    skipped, failed = [], []
    for name, job in jobs:
        if over_budget():
            skipped.append(name)
            continue
        print(f"[{time.time() - T0:6.1f}s] {name}")
        try:
            job()
        except Exception as e:  # keep going: one broken kernel must not hide the others
            traceback.print_exc()
            failed.append(f"{name}: {type(e).__name__}: {e}"[:500])
        if CUDA:
            torch.cuda.empty_cache()
        write(info, skipped, failed)
    write(info, skipped, failed, final=True)


def write(info, skipped, failed, final=False):
    doc = dict(info, elapsed_s=round(time.time() - T0, 1), skipped=skipped, failed=failed, rows=ROWS)
    out = Path(os.environ.get("OUT", ROOT / "out")) / "kernels-h200.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    if not final:
        return
    print(json.dumps(doc))
    print(f"\n{'kernel':9s} {'case':26s} {'B':>4s} {'err':>9s} ok    {'t_us':>8s} {'ref_us':>8s} "
          f"{'GB/s':>6s} {'%BW':>4s} {'floor_us':>8s}")
    for r in ROWS:
        print(f"{r['kernel']:9s} {r['case']:26s} {r['B']:4d} {r['err']:9.2e} {str(r['ok']):5s} "
              f"{r['t_kernel_us']:8.1f} {r['t_ref_us'] or 0:8.1f} {r['gbps']:6.0f} {100 * r['bw_frac']:4.0f} "
              f"{r['floor_us']:8.1f}")
    print(f"skipped (budget): {skipped}\nfailed: {failed}\nelapsed {time.time() - T0:.0f}s")


if __name__ == "__main__":
    main()
