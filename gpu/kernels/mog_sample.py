"""MoG head mixture choice (docs/MODEL.md §2.5 step 5): top-p filter, then the Gumbel-max draw.

Per row: p = softmax(logits); sort p descending (ties by index); keep an item while the sum of
the probabilities before it is < top_p, else set its logit to -1e9;
k = argmax(logit' - log(-log(U + 1e-8) + 1e-8)), first index on ties.
Two algorithms, same result. algo="sort" (default): one program per row sorts p with tl.sort;
the cumulative sum gives the kept count and the smallest kept probability thr; an item is kept iff
p > thr, or p == thr and it is among the first (by index) tied items the sorted prefix kept.
algo="pairwise": the mass before item i is Σ_{p_j > p_i} p_j + p_i·#{j < i : p_j = p_i}
(M² compares); launch 1, grid (B, M/ITEMS), scores ITEMS items per program and writes a partial
(best score, first index); launch 2 takes the argmax of the partials. The interpreter's tl.sort
costs seconds per row at M = 1024, so CPU tests run "sort" at small M and "pairwise" at full M.
Bytes: 8·M per row in, 4 out; both are latency-bound, "sort" by far the faster on the GPU
(bench/results/kernels-h200.json).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu.kernels._check import check, next_pow2


@triton.jit
def _mog_kernel(LOGITS, U, PART_S, PART_I, M, top_p, N_PART: tl.constexpr, ITEMS: tl.constexpr,
                BLOCK_M: tl.constexpr, CHUNK: tl.constexpr):
    b = tl.program_id(0)
    part = tl.program_id(1)
    j = tl.arange(0, BLOCK_M)
    x = tl.load(LOGITS + b * M + j, mask=j < M, other=float("-inf"))
    mx = tl.max(x, axis=0)
    den = tl.sum(tl.where(j < M, tl.exp(x - mx), 0.0), axis=0)
    p = tl.where(j < M, tl.exp(x - mx), 0.0) / den              # [BLOCK_M], padding 0
    best = tl.full([CHUNK], float("-inf"), tl.float32)           # running argmax per lane
    best_i = tl.zeros([CHUNK], tl.int32)
    for c in range(0, ITEMS, CHUNK):
        i = part * ITEMS + c + tl.arange(0, CHUNK)
        mi = i < M
        xi = tl.load(LOGITS + b * M + i, mask=mi, other=float("-inf"))
        pi = tl.where(mi, tl.exp(xi - mx), 0.0) / den           # bit-identical to p[i]
        above = p[None, :] > pi[:, None]
        tied_before = (p[None, :] == pi[:, None]) & (j[None, :] < i[:, None])
        before = (tl.sum(tl.where(above, p[None, :], 0.0), axis=1)
                  + tl.sum(tied_before.to(tl.float32), axis=1) * pi)
        u = tl.load(U + b * M + i, mask=mi, other=0.5)
        score = tl.where(before < top_p, xi, -1e9) - tl.log(-tl.log(u + 1e-8) + 1e-8)
        score = tl.where(mi, score, float("-inf"))
        better = score > best                                   # strict: earlier index wins
        best_i = tl.where(better, i, best_i)
        best = tl.where(better, score, best)
    top = tl.max(best, axis=0)
    tl.store(PART_S + b * N_PART + part, top)
    tl.store(PART_I + b * N_PART + part, tl.min(tl.where(best == top, best_i, 2147483647), axis=0))


@triton.jit
def _argmax_kernel(PART_S, PART_I, K_OUT, N_PART: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    s = tl.arange(0, BLOCK)
    ms = s < N_PART
    sc = tl.load(PART_S + b * N_PART + s, mask=ms, other=float("-inf"))
    idx = tl.load(PART_I + b * N_PART + s, mask=ms, other=2147483647)
    tl.store(K_OUT + b, tl.min(tl.where(sc == tl.max(sc, axis=0), idx, 2147483647), axis=0))


@triton.jit
def _mog_sort_kernel(LOGITS, U, K_OUT, M, top_p, BLOCK_M: tl.constexpr):
    # algo="sort", grid (B,): see the top comment.
    b = tl.program_id(0)
    i = tl.arange(0, BLOCK_M)
    mi = i < M
    x = tl.load(LOGITS + b * M + i, mask=mi, other=float("-inf"))
    e = tl.where(mi, tl.exp(x - tl.max(x, axis=0)), 0.0)
    p = e / tl.sum(e, axis=0)
    ps = tl.sort(p, descending=True)
    kept = (tl.cumsum(ps, axis=0) - ps) < top_p               # mass before each sorted item
    thr = tl.min(tl.where(kept, ps, float("inf")), axis=0)
    n_tied_kept = tl.sum((kept & (ps == thr)).to(tl.int32), axis=0)
    tied = ((p == thr) & mi).to(tl.int32)
    keep = (p > thr) | ((tied > 0) & ((tl.cumsum(tied, axis=0) - tied) < n_tied_kept))
    u = tl.load(U + b * M + i, mask=mi, other=0.5)
    score = tl.where(keep & mi, x, -1e9) - tl.log(-tl.log(u + 1e-8) + 1e-8)
    score = tl.where(mi, score, float("-inf"))
    tl.store(K_OUT + b, tl.argmax(score, axis=0, tie_break_left=True).to(tl.int32))


def mog_sample(logits, U, *, top_p: float = 0.95, out=None, items: int = 16, num_warps: int | None = None,
               algo: str = "sort"):
    """logits [B, M] fp32, U [B, M] fp32 uniforms in [0, 1) -> k int32[B] (into `out` if given).
    algo "sort" (default: 1 launch, one tl.sort per row, the faster on the GPU) or "pairwise"
    (2 launches, M² compares: slower on the GPU but fast in the CPU interpreter). num_warps
    defaults to the best of bench/results/kernels-h200*.json: 8 for "sort", 4 for "pairwise"."""
    batch, m = logits.shape
    dev = logits.device
    check("logits", logits, (batch, m), torch.float32, device=dev)
    check("U", U, (batch, m), torch.float32, device=dev)
    assert 0.0 < top_p <= 1.0, top_p
    assert items == next_pow2(items), items
    if out is None:
        out = torch.empty(batch, device=dev, dtype=torch.int32)
    check("out", out, (batch,), torch.int32, device=dev)
    assert algo in ("pairwise", "sort"), algo
    if algo == "sort":
        _mog_sort_kernel[(batch,)](logits, U, out, m, float(top_p), BLOCK_M=next_pow2(m),
                                   num_warps=num_warps or 8)
        return out
    chunk = min(16, next_pow2(m))
    items = max(chunk, min(items, next_pow2(m)))
    n_part = triton.cdiv(m, items)
    part_s = torch.empty(batch, n_part, device=dev, dtype=torch.float32)
    part_i = torch.empty(batch, n_part, device=dev, dtype=torch.int32)
    _mog_kernel[(batch, n_part)](logits, U, part_s, part_i, m, float(top_p), N_PART=n_part, ITEMS=items,
                                 BLOCK_M=next_pow2(m), CHUNK=chunk, num_warps=num_warps or 4)
    _argmax_kernel[(batch,)](part_s, part_i, out, N_PART=n_part, BLOCK=next_pow2(n_part), num_warps=1)
    return out


def mog_sample_ref(logits, U, *, top_p: float = 0.95, out=None, items: int = 16,
                   num_warps: int | None = None, algo: str = "sort"):
    """PyTorch twin (same signature; items/num_warps/algo ignored): sort, cumsum, mask, Gumbel argmax."""
    sp, order = torch.sort(torch.softmax(logits, dim=-1), dim=-1, descending=True, stable=True)
    drop_sorted = (torch.cumsum(sp, dim=-1) - sp) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    score = logits.masked_fill(drop, -1e9) - torch.log(-torch.log(U + 1e-8) + 1e-8)
    k = torch.argmax(score, dim=-1).to(torch.int32)
    if out is None:
        return k
    out.copy_(k)
    return out
