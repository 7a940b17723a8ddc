"""MoG head mixture choice (MODEL.md §2.5 step 5): top-p filter, then the Gumbel-max draw.

Per row: p = softmax(logits); sort p descending (ties by index); keep an item while the sum of
the probabilities before it is < top_p, else set its logit to -1e9;
k = argmax(logit' - log(-log(U + 1e-8) + 1e-8)), first index on ties.
No sort: the mass before item i in that order is Σ_{p_j > p_i} p_j + p_i·#{j < i : p_j = p_i},
computed pairwise (M² compares, ~1 M per row at M = 1024: a few µs on the GPU, and fast in the
interpreter, whose tl.sort costs seconds per row). One program per row keeps all M probabilities
in registers and walks the items in chunks of CHUNK, carrying a running argmax per lane.
Bytes: 8·M per row in (logits and U, each chunk re-read from L1/L2), 4 out.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu.kernels._check import check, next_pow2


@triton.jit
def _mog_kernel(LOGITS, U, K_OUT, M, top_p, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr):
    b = tl.program_id(0)
    j = tl.arange(0, BLOCK_M)
    x = tl.load(LOGITS + b * M + j, mask=j < M, other=float("-inf"))
    mx = tl.max(x, axis=0)
    den = tl.sum(tl.where(j < M, tl.exp(x - mx), 0.0), axis=0)
    p = tl.where(j < M, tl.exp(x - mx), 0.0) / den              # [BLOCK_M], padding 0
    best = tl.full([CHUNK], float("-inf"), tl.float32)           # running argmax per lane
    best_i = tl.zeros([CHUNK], tl.int32)
    for c in range(0, BLOCK_M, CHUNK):
        i = c + tl.arange(0, CHUNK)
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
    k = tl.min(tl.where(best == top, best_i, BLOCK_M), axis=0)
    tl.store(K_OUT + b, k)


def mog_sample(logits, U, *, top_p: float = 0.95, out=None):
    """logits [B, M] fp32, U [B, M] fp32 uniforms in [0, 1) -> k int32[B] (into `out` if given)."""
    batch, m = logits.shape
    dev = logits.device
    check("logits", logits, (batch, m), torch.float32, device=dev)
    check("U", U, (batch, m), torch.float32, device=dev)
    assert 0.0 < top_p <= 1.0, top_p
    if out is None:
        out = torch.empty(batch, device=dev, dtype=torch.int32)
    check("out", out, (batch,), torch.int32, device=dev)
    _mog_kernel[(batch,)](logits, U, out, m, float(top_p), BLOCK_M=next_pow2(m), CHUNK=16, num_warps=8)
    return out


def mog_sample_ref(logits, U, *, top_p: float = 0.95, out=None):
    """PyTorch twin (same signature): sort, cumulative sum, mask, Gumbel argmax."""
    sp, order = torch.sort(torch.softmax(logits, dim=-1), dim=-1, descending=True, stable=True)
    drop_sorted = (torch.cumsum(sp, dim=-1) - sp) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    score = logits.masked_fill(drop, -1e9) - torch.log(-torch.log(U + 1e-8) + 1e-8)
    k = torch.argmax(score, dim=-1).to(torch.int32)
    if out is None:
        return k
    out.copy_(k)
    return out
