"""Residual add + LayerNorm in one launch: the perception Conformer's sublayer boundary.

Per row (x, y [N], weight/bias [N]; weight2/bias2 optional):
    s  = x + alpha·y          in fp32, rounded once to x's dtype: torch.add(x, y, alpha=alpha)
    u  = LN(s; weight, bias)  mean and variance in fp32, output in x's dtype: F.layer_norm
    u2 = LN(u; weight2, bias2) when weight2 is given (norm_out, then the next layer's
                              norm_feed_forward1: two LayerNorms back to back)
Why: a Conformer layer ends each of its four sublayers with x ← x + c·y and starts the next with
LN(x): two launches of a few µs on a [B·F, 1024] row set of a few hundred KB, 24 layers a step on
the beat's critical path. Here one launch reads x and y once and writes s, u (and u2).
torch's bf16 add is the fp32 sum rounded once (the same here); with alpha 0.5 or 1 the product
alpha·y is exact, so s equals torch's bit for bit in both dtypes. LN differs from torch's by the
reduction order and the GPU's rsqrt: ~1e-6 relative in fp32, an occasional 1-ulp flip in bf16.
bf16 roundings are done in integer bits (`_round_bf16`: the interpreter's cast truncates).
Layout: x, y [..., N] with unit stride in N and leading dims that collapse to one row stride
each (the model's first x is the kept frame sliced out of the subsampler's output); outputs are
new contiguous tensors. ROWS whole rows of BLOCK_N = next_pow2(N) lanes a program (4 at N 1024).
Bytes per row: read 2·N·elem (+ weights, cached), write 2·N·elem (3 with u2).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from gpu.kernels._check import check
from gpu.kernels.rms_norm import _launch_shape, _round_bf16, _rows_view

DTYPES = (torch.float32, torch.bfloat16)


@triton.jit
def _layer_norm_rows(s, mc, W, B, c, N, eps, HAS_BIAS: tl.constexpr, BF16: tl.constexpr):
    # s [ROWS, BLOCK_N] fp32 (padding lanes 0) → LN(s) in fp32, rounded to bf16 when BF16
    mean = tl.sum(s, axis=1) / N
    d = tl.where(mc[None, :], s - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(d * d, axis=1) / N + eps)
    u = d * rstd[:, None] * tl.load(W + c, mask=mc, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        u += tl.load(B + c, mask=mc, other=0.0).to(tl.float32)[None, :]
    if BF16:
        u = _round_bf16(u)
    return u


@triton.jit
def _add_layer_norm_kernel(X, Y, W, B, W2, B2, S_OUT, U_OUT, U2_OUT, n_rows, N, stride_x,
                           stride_y, alpha, eps, eps2, BF16: tl.constexpr, HAS_BIAS: tl.constexpr,
                           HAS_NORM2: tl.constexpr, HAS_BIAS2: tl.constexpr,
                           ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK_N)
    mc = c < N
    m = (r < n_rows)[:, None] & mc[None, :]
    r64 = r.to(tl.int64)
    x = tl.load(X + r64[:, None] * stride_x + c[None, :], mask=m, other=0.0).to(tl.float32)
    y = tl.load(Y + r64[:, None] * stride_y + c[None, :], mask=m, other=0.0).to(tl.float32)
    s = x + alpha * y
    if BF16:
        s = _round_bf16(s)
    out = r64[:, None] * N + c[None, :]
    tl.store(S_OUT + out, s.to(S_OUT.dtype.element_ty), mask=m)
    u = _layer_norm_rows(s, mc, W, B, c, N, eps, HAS_BIAS, BF16)
    tl.store(U_OUT + out, u.to(U_OUT.dtype.element_ty), mask=m)
    if HAS_NORM2:
        u2 = _layer_norm_rows(u, mc, W2, B2, c, N, eps2, HAS_BIAS2, BF16)
        tl.store(U2_OUT + out, u2.to(U2_OUT.dtype.element_ty), mask=m)


def add_layer_norm(x, y, alpha: float, weight, bias, eps: float, weight2=None, bias2=None,
                   eps2: float | None = None):
    """x, y [..., N] fp32|bf16 (same shape and dtype; unit stride in N, leading dims collapsible
    to one row stride), weight/bias [N] fp32|bf16 (bias may be None) → (s, u, u2) new contiguous
    tensors of x's shape and dtype (see the top comment); u2 is None without weight2."""
    n = x.shape[-1]
    dev = x.device
    check("x", x, (None,) * x.dim(), DTYPES, contiguous=False, device=dev)
    check("y", y, tuple(x.shape), x.dtype, contiguous=False, device=dev)
    for name, w in (("weight", weight), ("bias", bias), ("weight2", weight2), ("bias2", bias2)):
        if w is not None:
            check(name, w, (n,), DTYPES, device=dev)
    assert bias2 is None or weight2 is not None, "bias2 without weight2"
    x2, y2 = _rows_view(x, n), _rows_view(y, n)
    rows = x2.shape[0]
    new = lambda: torch.empty(x.shape, device=dev, dtype=x.dtype)
    s, u, u2 = new(), new(), None if weight2 is None else new()
    if rows == 0:
        return s, u, u2
    block_n, n_rows_prog, num_warps = _launch_shape(n, rows)
    given = lambda t, stand_in: stand_in if t is None else t     # absent: never read (flags)
    _add_layer_norm_kernel[(triton.cdiv(rows, n_rows_prog),)](
        x2, y2, weight, given(bias, weight), given(weight2, weight), given(bias2, weight), s, u,
        given(u2, u), rows, n, x2.stride(0), y2.stride(0), float(alpha), float(eps),
        float(given(eps2, eps)), BF16=x.dtype == torch.bfloat16, HAS_BIAS=bias is not None,
        HAS_NORM2=weight2 is not None, HAS_BIAS2=bias2 is not None, ROWS=n_rows_prog,
        BLOCK_N=block_n, num_warps=num_warps)
    return s, u, u2


def add_layer_norm_ref(x, y, alpha: float, weight, bias, eps: float, weight2=None, bias2=None,
                       eps2: float | None = None):
    """PyTorch twin (same signature): the Conformer layer's own ops."""
    n = x.shape[-1:]
    s = torch.add(x, y, alpha=alpha)
    u = F.layer_norm(s, n, weight, bias, eps)
    if weight2 is None:
        return s, u, None
    return s, u, F.layer_norm(u, n, weight2, bias2, eps if eps2 is None else eps2)
