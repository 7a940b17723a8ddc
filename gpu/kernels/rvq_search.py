"""Greedy L2 residual VQ over w consecutive codebooks (MODEL.md §2.5 step 5, last bullet).

For j = j0 .. j0+w-1:  c_j = argmin_i(‖e_i‖² − 2 r·e_i)  (e = codebooks[j], first index on ties);
r ← r − e_{c_j};  q ← q + e_{c_j}.  ‖e‖² is precomputed once (rvq_sqnorm).
The steps are sequential, each an argmin over all 1024 codes, so one launch per step t = 0..w:
grid (row tiles, code splits). Launch t first finishes step t−1 (every program merges the split
partials of t−1 and rebuilds its rows' r = r_prev − e_c on the fly; the code-split-0 programs
write c_{t−1}, r and q), then scores its BLOCK_N codes of codebook j0+t and writes a partial
(min, argmin). r, q and the partials ping-pong between two buffers, so no launch reads what it
writes. Bytes per step: one codebook (2 MB at full shape, re-read from L2 by each row tile) plus
4·B·D for r and q. Scores use tl.dot with `precision` ("tf32x3" ≈ fp32 at tensor-core speed,
"ieee" = plain fp32 FMAs); the interpreter computes both in fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu.kernels._check import check, next_pow2


@triton.jit
def _rvq_kernel(R_PREV, Q_PREV, R_NEXT, Q_NEXT, CB, SQN, PD_PREV, PI_PREV, PD_CUR, PI_CUR, CODES,
                n_rows, t, w, j_prev, j_cur,
                DIM: tl.constexpr, N_CODES: tl.constexpr, N_SPLITS: tl.constexpr,
                HAS_PREV: tl.constexpr, DO_SEARCH: tl.constexpr, PREC: tl.constexpr,
                BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                BLOCK_S: tl.constexpr):
    pid_n = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    mr = rows < n_rows
    codes_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = codes_n < N_CODES
    writer = pid_n == 0                       # one program per row tile writes r, q, codes
    if HAS_PREV:                              # merge step t-1: min over splits, first split on ties
        s = tl.arange(0, BLOCK_S)
        pm = mr[:, None] & (s[None, :] < N_SPLITS)
        pd = tl.load(PD_PREV + rows[:, None] * N_SPLITS + s[None, :], mask=pm, other=float("inf"))
        pi = tl.load(PI_PREV + rows[:, None] * N_SPLITS + s[None, :], mask=pm, other=0)
        first = tl.min(tl.where(pd == tl.min(pd, axis=1)[:, None], s[None, :], BLOCK_S), axis=1)
        c_prev = tl.sum(tl.where(s[None, :] == first[:, None], pi, 0), axis=1)
        tl.store(CODES + rows * w + (t - 1), c_prev, mask=mr & writer)
        e_rows = CB + j_prev * N_CODES * DIM + c_prev[:, None] * DIM
    acc = tl.zeros([BLOCK_B, BLOCK_N], tl.float32)
    for k0 in range(0, DIM, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        mk = kk < DIM
        rk = mr[:, None] & mk[None, :]
        r = tl.load(R_PREV + rows[:, None] * DIM + kk[None, :], mask=rk, other=0.0)
        if HAS_PREV:
            e = tl.load(e_rows + kk[None, :], mask=rk, other=0.0)
            r = r - e
            tl.store(R_NEXT + rows[:, None] * DIM + kk[None, :], r, mask=rk & writer)
            qv = tl.load(Q_PREV + rows[:, None] * DIM + kk[None, :], mask=rk & writer, other=0.0)
            tl.store(Q_NEXT + rows[:, None] * DIM + kk[None, :], qv + e, mask=rk & writer)
        if DO_SEARCH:
            cb = tl.load(CB + j_cur * N_CODES * DIM + codes_n[:, None] * DIM + kk[None, :],
                         mask=mn[:, None] & mk[None, :], other=0.0)
            acc += tl.dot(r, tl.trans(cb), input_precision=PREC)
    if DO_SEARCH:
        sqn = tl.load(SQN + j_cur * N_CODES + codes_n, mask=mn, other=0.0)
        dist = tl.where(mn[None, :], sqn[None, :] - 2.0 * acc, float("inf"))
        dmin = tl.min(dist, axis=1)
        amin = tl.min(tl.where(dist == dmin[:, None], codes_n[None, :], N_CODES), axis=1)
        tl.store(PD_CUR + rows * N_SPLITS + pid_n, dmin, mask=mr)
        tl.store(PI_CUR + rows * N_SPLITS + pid_n, amin, mask=mr)


def rvq_sqnorm(codebooks: torch.Tensor) -> torch.Tensor:
    """‖e‖² [n_books, n_codes] fp32, computed once at load."""
    return codebooks.float().pow(2).sum(-1)


def rvq_search(r, q, codebooks, sqnorm, j0: int, w: int, *, out=None, precision: str = "tf32x3",
               block_b: int = 16, block_n: int = 64, block_k: int = 64, num_warps: int = 4):
    """r, q [B, D] fp32 (updated in place); codebooks [NB, NC, D] fp32; sqnorm [NB, NC] fp32.
    Returns (codes int32[B, w] (into `out` if given), q, r). w + 1 launches."""
    batch, dim = r.shape
    n_books, n_codes, _ = codebooks.shape
    dev = r.device
    check("r", r, (batch, dim), torch.float32, device=dev)
    check("q", q, (batch, dim), torch.float32, device=dev)
    check("codebooks", codebooks, (n_books, n_codes, dim), torch.float32, device=dev)
    check("sqnorm", sqnorm, (n_books, n_codes), torch.float32, device=dev)
    assert 0 <= j0 and w >= 1 and j0 + w <= n_books, (j0, w, n_books)
    assert precision in ("tf32x3", "ieee"), precision
    if out is None:
        out = torch.empty(batch, w, device=dev, dtype=torch.int32)
    check("out", out, (batch, w), torch.int32, device=dev)
    bn = min(block_n, next_pow2(n_codes))
    n_splits = triton.cdiv(n_codes, bn)
    # ping-pong: r_t, q_t (after t updates) live in buffer t % 2; buffer w % 2 must be r, q
    r_tmp, q_tmp = torch.empty_like(r), torch.empty_like(q)
    if w % 2:
        r_tmp.copy_(r)
        q_tmp.copy_(q)
        rb, qb = (r_tmp, r), (q_tmp, q)
    else:
        rb, qb = (r, r_tmp), (q, q_tmp)
    pd = [torch.empty(batch, n_splits, device=dev, dtype=torch.float32) for _ in range(2)]
    pi = [torch.empty(batch, n_splits, device=dev, dtype=torch.int32) for _ in range(2)]
    for t in range(w + 1):
        search = t < w
        prev, cur = (t - 1) % 2 if t else 0, t % 2
        _rvq_kernel[(triton.cdiv(batch, block_b), n_splits if search else 1)](
            rb[prev], qb[prev], rb[cur], qb[cur], codebooks, sqnorm, pd[prev], pi[prev], pd[cur], pi[cur],
            out, batch, t, w, j0 + t - 1, j0 + t, DIM=dim, N_CODES=n_codes, N_SPLITS=n_splits,
            HAS_PREV=t > 0, DO_SEARCH=search, PREC=precision, BLOCK_B=block_b, BLOCK_N=bn,
            BLOCK_K=min(block_k, max(16, next_pow2(dim))), BLOCK_S=next_pow2(n_splits), num_warps=num_warps)
    return out, q, r


def rvq_search_ref(r, q, codebooks, sqnorm, j0: int, w: int, *, out=None, precision: str = "tf32x3",
                   block_b: int = 16, block_n: int = 64, block_k: int = 64, num_warps: int = 4):
    """PyTorch twin (same signature; precision/blocks ignored): the loop as written in MODEL.md."""
    codes = []
    for j in range(j0, j0 + w):
        e = codebooks[j].to(r.dtype)                               # [NC, D]
        c = torch.argmin(sqnorm[j].to(r.dtype)[None, :] - 2.0 * (r @ e.T), dim=-1)
        r.sub_(e[c])
        q.add_(e[c])
        codes.append(c)
    codes = torch.stack(codes, dim=1).to(torch.int32)
    if out is not None:
        out.copy_(codes)
        codes = out
    return codes, q, r
