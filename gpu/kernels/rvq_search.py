"""Greedy L2 residual VQ over w consecutive codebooks (MODEL.md §2.5 step 5, last bullet).

For j = j0 .. j0+w-1:  c_j = argmin_i(‖e_i‖² − 2 r·e_i)  (e = codebooks[j], first index on ties);
r ← r − e_{c_j};  q ← q + e_{c_j}.  ‖e‖² is precomputed once (rvq_sqnorm).
The steps are sequential, each an argmin over all 1024 codes, spread over a grid (row tiles,
code splits). Step t = 0..w first finishes step t−1 (every program merges the split partials of
t−1 and rebuilds its rows' r = r_prev − e_c on the fly; the code-split-0 programs write c_{t−1},
r and q), then scores its BLOCK_N codes of codebook j0+t and writes a partial (min, argmin).
r, q and the partials ping-pong between two buffers, so no step reads what it writes.

Two ways to run the w + 1 steps, one kernel body:
- `chain=True`: one cooperative launch; the programs of a row tile meet at a grid barrier
  (gpu/wpk/sync.py, a counter per row tile) between steps (issue 18, stage 0). The grid must
  fit on the device at once (else CUDA refuses the launch: "too many blocks").
- `chain=False`: one launch per step, the launch boundary as the barrier. The interpreter runs
  a grid's programs one after another, so it takes this form (the chain is tested there on
  threads: `rvq_launch` + `gpu.wpk.testing.threaded`).

Bytes per step: one codebook (2 MB at full shape, re-read from L2 by each row tile) plus
4·B·D for r and q. Scores use tl.dot with `precision` ("tf32x3" ≈ fp32 at tensor-core speed,
"ieee" = plain fp32 FMAs); the interpreter computes both in fp32.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gpu.kernels._check import check, next_pow2
from gpu.wpk.sync import grid_barrier, interp


@triton.jit
def _rvq_step(R_PREV, Q_PREV, R_NEXT, Q_NEXT, CB, SQN, PD_PREV, PI_PREV, PD_CUR, PI_CUR, CODES,
              n_rows, t, w, j_prev, j_cur,
              DIM: tl.constexpr, N_CODES: tl.constexpr, N_SPLITS: tl.constexpr,
              PREC: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr):
    has_prev = t > 0
    do_search = t < w
    pid_n = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    mr = rows < n_rows
    codes_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = codes_n < N_CODES
    writer = pid_n == 0                       # one program per row tile writes r, q, codes
    # merge step t-1: min over splits, first split on ties (no rows at t = 0: c_prev unused)
    s = tl.arange(0, BLOCK_S)
    pm = (mr & has_prev)[:, None] & (s[None, :] < N_SPLITS)
    pd = tl.load(PD_PREV + rows[:, None] * N_SPLITS + s[None, :], mask=pm, other=float("inf"))
    pi = tl.load(PI_PREV + rows[:, None] * N_SPLITS + s[None, :], mask=pm, other=0)
    first = tl.min(tl.where(pd == tl.min(pd, axis=1)[:, None], s[None, :], BLOCK_S), axis=1)
    c_prev = tl.sum(tl.where(s[None, :] == first[:, None], pi, 0), axis=1)
    c_prev = tl.minimum(tl.maximum(c_prev, 0), N_CODES - 1)    # an unwritten partial stays in bounds
    tl.store(CODES + rows * w + (t - 1), c_prev, mask=mr & writer & has_prev)
    e_rows = CB + j_prev * N_CODES * DIM + c_prev[:, None] * DIM
    acc = tl.zeros([BLOCK_B, BLOCK_N], tl.float32)
    for k0 in range(0, DIM, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        mk = kk < DIM
        rk = mr[:, None] & mk[None, :]
        # r_{t-1} from the previous buffer; at t = 0, r_0 from this step's (no update)
        r = (tl.load(R_PREV + rows[:, None] * DIM + kk[None, :], mask=rk & has_prev, other=0.0)
             + tl.load(R_NEXT + rows[:, None] * DIM + kk[None, :], mask=rk & (t == 0), other=0.0))
        if has_prev:
            e = tl.load(e_rows + kk[None, :], mask=rk, other=0.0)
            r = r - e
            tl.store(R_NEXT + rows[:, None] * DIM + kk[None, :], r, mask=rk & writer)
            qv = tl.load(Q_PREV + rows[:, None] * DIM + kk[None, :], mask=rk & writer, other=0.0)
            tl.store(Q_NEXT + rows[:, None] * DIM + kk[None, :], qv + e, mask=rk & writer)
        if do_search:
            cb = tl.load(CB + j_cur * N_CODES * DIM + codes_n[:, None] * DIM + kk[None, :],
                         mask=mn[:, None] & mk[None, :], other=0.0)
            acc += tl.dot(r, tl.trans(cb), input_precision=PREC)
    if do_search:
        sqn = tl.load(SQN + j_cur * N_CODES + codes_n, mask=mn, other=0.0)
        dist = tl.where(mn[None, :], sqn[None, :] - 2.0 * acc, float("inf"))
        dmin = tl.min(dist, axis=1)
        amin = tl.min(tl.where(dist == dmin[:, None], codes_n[None, :], N_CODES), axis=1)
        tl.store(PD_CUR + rows * N_SPLITS + pid_n, dmin, mask=mr)
        tl.store(PI_CUR + rows * N_SPLITS + pid_n, amin, mask=mr)


@triton.jit
def _rvq_kernel(R_A, Q_A, R_B, Q_B, CB, SQN, PD_A, PI_A, PD_B, PI_B, CODES, BARRIER,
                n_rows, t_begin, t_end, w, j0,
                DIM: tl.constexpr, N_CODES: tl.constexpr, N_SPLITS: tl.constexpr,
                PREC: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr, CHAIN: tl.constexpr,
                IS_INTERP: tl.constexpr):
    """Steps t_begin .. t_end-1. r_t, q_t (after t updates) live in buffer A for even t, B for
    odd t, and so do step t's partials."""
    for t in range(t_begin, t_end):
        if t % 2 == 0:
            _rvq_step(R_B, Q_B, R_A, Q_A, CB, SQN, PD_B, PI_B, PD_A, PI_A, CODES, n_rows, t, w,
                      j0 + t - 1, j0 + t, DIM, N_CODES, N_SPLITS, PREC, BLOCK_B, BLOCK_N,
                      BLOCK_K, BLOCK_S)
        else:
            _rvq_step(R_A, Q_A, R_B, Q_B, CB, SQN, PD_A, PI_A, PD_B, PI_B, CODES, n_rows, t, w,
                      j0 + t - 1, j0 + t, DIM, N_CODES, N_SPLITS, PREC, BLOCK_B, BLOCK_N,
                      BLOCK_K, BLOCK_S)
        if CHAIN:
            if t + 1 < t_end:               # a row tile's splits meet before the next step
                grid_barrier(BARRIER + tl.program_id(0), t - t_begin + 1, N_SPLITS, IS_INTERP)


def rvq_sqnorm(codebooks: torch.Tensor) -> torch.Tensor:
    """‖e‖² [n_books, n_codes] fp32, computed once at load."""
    return codebooks.float().pow(2).sum(-1)


@dataclass
class RvqLaunch:
    """One search's launches: `kernel[grid](*args_for(t0, t1), **meta)` runs steps t0..t1-1."""
    grid: tuple
    steps: int
    chain: bool
    buffers: tuple
    scalars: tuple
    meta: dict

    def args_for(self, t_begin: int, t_end: int) -> tuple:
        n_rows, w, j0 = self.scalars
        return (*self.buffers, n_rows, t_begin, t_end, w, j0)


def rvq_launch(r, q, codebooks, sqnorm, j0: int, w: int, *, out=None, precision: str = "tf32x3",
               block_b: int = 16, block_n: int = 64, block_k: int = 64, num_warps: int = 4,
               chain: bool = False) -> tuple[RvqLaunch, torch.Tensor]:
    """Checks the arguments and lays out the work buffers; returns the launch and `out`."""
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
    # r_t, q_t live in buffer A for even t, B for odd: the caller's r, q must be both r_0's
    # buffer (A) and r_w's, so for odd w they start in a copy
    r_tmp, q_tmp = torch.empty_like(r), torch.empty_like(q)
    if w % 2:
        r_tmp.copy_(r)
        q_tmp.copy_(q)
        (ra, qa), (rb, qb) = (r_tmp, q_tmp), (r, q)
    else:
        (ra, qa), (rb, qb) = (r, q), (r_tmp, q_tmp)
    pd = [torch.empty(batch, n_splits, device=dev, dtype=torch.float32) for _ in range(2)]
    pi = [torch.empty(batch, n_splits, device=dev, dtype=torch.int32) for _ in range(2)]
    row_tiles = triton.cdiv(batch, block_b)
    # a memset node in a captured graph: every replay's barriers count from 0
    barrier = torch.zeros(row_tiles if chain else 1, device=dev, dtype=torch.int32)
    meta = dict(DIM=dim, N_CODES=n_codes, N_SPLITS=n_splits, PREC=precision, BLOCK_B=block_b,
                BLOCK_N=bn, BLOCK_K=min(block_k, max(16, next_pow2(dim))),
                BLOCK_S=next_pow2(n_splits), CHAIN=chain, IS_INTERP=interp(),
                num_warps=num_warps)
    buffers = (ra, qa, rb, qb, codebooks, sqnorm, pd[0], pi[0], pd[1], pi[1], out, barrier)
    return RvqLaunch((row_tiles, n_splits), w + 1, chain, buffers, (batch, w, j0), meta), out


def rvq_search(r, q, codebooks, sqnorm, j0: int, w: int, *, out=None, precision: str = "tf32x3",
               block_b: int = 16, block_n: int = 64, block_k: int = 64, num_warps: int = 4,
               chain: bool = False):
    """r, q [B, D] fp32 (updated in place); codebooks [NB, NC, D] fp32; sqnorm [NB, NC] fp32.
    Returns (codes int32[B, w] (into `out` if given), q, r). `chain`: one cooperative launch
    (a device only: every program of the grid must be resident), else w + 1 launches."""
    launch, out = rvq_launch(r, q, codebooks, sqnorm, j0, w, out=out, precision=precision,
                             block_b=block_b, block_n=block_n, block_k=block_k,
                             num_warps=num_warps, chain=chain)
    if chain:
        assert not interp(), "a chained search needs a device (or gpu.wpk.testing.threaded)"
        _rvq_kernel[launch.grid](*launch.args_for(0, launch.steps), **launch.meta,
                                 launch_cooperative_grid=True)
    else:
        for t in range(launch.steps):
            grid = launch.grid if t < w else (launch.grid[0], 1)
            _rvq_kernel[grid](*launch.args_for(t, t + 1), **launch.meta)
    return out, q, r


def rvq_search_ref(r, q, codebooks, sqnorm, j0: int, w: int, *, out=None, precision: str = "tf32x3",
                   block_b: int = 16, block_n: int = 64, block_k: int = 64, num_warps: int = 4,
                   chain: bool = False):
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
