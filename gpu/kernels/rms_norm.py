"""RMSNorm over the last dim, one launch, both conventions the models use.

Per row x[0:N], all in fp32 (r = rsqrt(Σx²/N + eps), y = x·r):
    plus_one=True,  round_first=False (Gemma talker, talker.text.RMSNorm):
        out = (y·(1 + w)).to(x.dtype)
    plus_one=False, round_first=True  (thinker, thinker.rms_norm):
        out = (y.to(x.dtype)·w).to(x.dtype)
The other two combinations follow the same rule: scale = (1 + w) if plus_one else w (in fp32,
w upcast exactly); y is first rounded to x.dtype if round_first; out = (y·scale).to(x.dtype).
Rounding round_first's y to bf16 then multiplying in fp32 is what torch does for bf16·bf16 (the
product of two bf16 is exact in fp32, so it is rounded once, to bf16). The one case the thinker
differs: bf16 x with fp32 w, where torch's promotion returns fp32; this returns x.dtype.
Differences from the twin are the order of the Σx² reduction and the GPU's rsqrt: inside 1e-5 relative
in fp32, and in bf16 an occasional 1-ulp flip where a value sits within that of a rounding boundary.
Both bf16 roundings are done in integer bits (round to nearest even, as torch and the GPU's
cvt.rn do): the Triton interpreter's fp32->bf16 cast truncates, which would make the CPU tests
disagree with torch by an ulp in about half the elements.
Layout: x [..., N] with unit stride in N and leading dims that collapse to one row stride (a
contiguous tensor, or rows sliced out of a wider one); out is a new contiguous tensor.
One program holds ROWS whole rows of BLOCK_N = next_pow2(N) lanes (ROWS·BLOCK_N ≈ 4096), so the
72-wide q/k head norms share a program 32 rows at a time.
Bytes: read N·(2|4) per row (+ w, cached), write the same: purely bandwidth-bound at thousands
of rows (torch's twin, several launches, is far slower); a few hundred rows are launch-bound
(host-side).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu.kernels._check import check, next_pow2

DTYPES = (torch.float32, torch.bfloat16)
TILE = 4096                 # elements per program (ROWS · BLOCK_N) when rows are narrow


@triton.jit
def _round_bf16(y):
    # fp32 -> the nearest bf16 value (ties to even, NaN kept), still as fp32, so the later cast to
    # bf16 is exact. Done in bits because the interpreter's fp32->bf16 cast truncates.
    b = y.to(tl.uint32, bitcast=True)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return tl.where(y != y, y, b.to(tl.float32, bitcast=True))


@triton.jit
def _rms_norm_kernel(X, W, OUT, n_rows, N, stride_x, eps, PLUS_ONE: tl.constexpr,
                     ROUND_FIRST: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK_N)
    mr = r < n_rows
    mc = c < N
    m = mr[:, None] & mc[None, :]
    r64 = r.to(tl.int64)
    x = tl.load(X + r64[:, None] * stride_x + c[None, :], mask=m, other=0.0).to(tl.float32)
    rs = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)             # [ROWS]; padding lanes add 0
    y = x * rs[:, None]
    if ROUND_FIRST:
        if X.dtype.element_ty == tl.bfloat16:
            y = _round_bf16(y)
    w = tl.load(W + c, mask=mc, other=0.0).to(tl.float32)
    if PLUS_ONE:
        w = 1.0 + w
    out = y * w[None, :]
    if OUT.dtype.element_ty == tl.bfloat16:
        out = _round_bf16(out)
    tl.store(OUT + r64[:, None] * N + c[None, :], out.to(OUT.dtype.element_ty), mask=m)


def _rows_view(x: torch.Tensor, n: int) -> torch.Tensor:
    """x [..., n] as [rows, n] without a copy; asserts when the leading dims need one."""
    assert x.stride(-1) == 1 or n == 1, f"x: last dim must have stride 1 (strides {x.stride()})"
    try:
        return x.view(-1, n)
    except RuntimeError:
        raise AssertionError(f"x: leading dims {tuple(x.shape[:-1])} with strides {x.stride()[:-1]} "
                             "do not collapse to one row stride; pass a contiguous tensor") from None


def _launch_shape(n: int, rows: int) -> tuple[int, int, int]:
    """(BLOCK_N, rows per program, warps) for whole rows of n: about TILE elements a program."""
    block_n = next_pow2(n)
    n_rows_prog = min(max(1, TILE // block_n), next_pow2(rows))
    tile = n_rows_prog * block_n
    return block_n, n_rows_prog, 4 if tile <= 4096 else 8 if tile <= 8192 else 16


def rms_norm(x, weight, eps: float, *, plus_one: bool, round_first: bool):
    """x [..., N] fp32|bf16 (unit stride in N, leading dims collapsible to one row stride),
    weight [N] fp32|bf16 -> new contiguous tensor of x's shape and dtype. See the top comment for
    plus_one / round_first."""
    assert x.dim() >= 1, "x: needs at least one dim"
    n = x.shape[-1]
    dev = x.device
    check("x", x, (None,) * x.dim(), DTYPES, contiguous=False, device=dev)
    check("weight", weight, (n,), DTYPES, device=dev)
    assert n >= 1, "x: empty last dim"
    x2 = _rows_view(x, n)
    rows = x2.shape[0]
    out = torch.empty(x.shape, device=dev, dtype=x.dtype)
    if rows == 0:
        return out
    block_n, n_rows_prog, num_warps = _launch_shape(n, rows)
    _rms_norm_kernel[(triton.cdiv(rows, n_rows_prog),)](
        x2, weight, out, rows, n, x2.stride(0), float(eps), PLUS_ONE=bool(plus_one),
        ROUND_FIRST=bool(round_first), ROWS=n_rows_prog, BLOCK_N=block_n, num_warps=num_warps)
    return out


def rms_norm_ref(x, weight, eps: float, *, plus_one: bool, round_first: bool):
    """PyTorch twin (same signature): the talker's RMSNorm when plus_one, the thinker's rms_norm
    when round_first, same op order as both."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if round_first:
        y = y.to(x.dtype).float()
    scale = 1.0 + weight.float() if plus_one else weight.float()
    return (y * scale).to(x.dtype)


# -- the Gemma residual step: x + norm(y), and the next sublayer's norm of that sum -------------------
# The talker's layers end each sublayer with x ← x + post_norm(y) and start the next with
# h = pre_norm(x): three launches of a few µs for a [B·R, 1152] fp32 row set that is a few hundred
# KB. One launch reads x and y once, writes x and h once. fp32 only: the talker is fp32 in both
# profiles (docs/MODEL.md §4), so there is no rounding rule to copy.

@triton.jit
def _residual_norm_kernel(X, Y, W_POST, W_NEXT, X_OUT, H_OUT, n_rows, N, stride_x, stride_y, eps,
                          HAS_NEXT: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK_N)
    mc = c < N
    m = (r < n_rows)[:, None] & mc[None, :]
    r64 = r.to(tl.int64)
    y = tl.load(Y + r64[:, None] * stride_y + c[None, :], mask=m, other=0.0)
    w = 1.0 + tl.load(W_POST + c, mask=mc, other=0.0)
    x = tl.load(X + r64[:, None] * stride_x + c[None, :], mask=m, other=0.0)
    x = x + y * tl.rsqrt(tl.sum(y * y, axis=1) / N + eps)[:, None] * w[None, :]
    tl.store(X_OUT + r64[:, None] * N + c[None, :], x, mask=m)
    if HAS_NEXT:
        w2 = 1.0 + tl.load(W_NEXT + c, mask=mc, other=0.0)
        h = x * tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)[:, None] * w2[None, :]
        tl.store(H_OUT + r64[:, None] * N + c[None, :], h, mask=m)


def residual_rms_norm(x, y, w_post, eps: float, w_next=None):
    """Gemma's (plus_one) residual step in one launch, fp32: x [..., N], y [..., N] (unit stride in
    N, leading dims collapsible to one row stride), w_post, w_next [N] fp32 ->
    (x + norm(y; w_post), norm(that; w_next) or None when w_next is None), new contiguous
    tensors of x's shape."""
    n = x.shape[-1]
    dev = x.device
    check("x", x, (None,) * x.dim(), (torch.float32,), contiguous=False, device=dev)
    check("y", y, tuple(x.shape), (torch.float32,), contiguous=False, device=dev)
    check("w_post", w_post, (n,), (torch.float32,), device=dev)
    if w_next is not None:
        check("w_next", w_next, (n,), (torch.float32,), device=dev)
    x2, y2 = _rows_view(x, n), _rows_view(y, n)
    rows = x2.shape[0]
    x_out = torch.empty(x.shape, device=dev, dtype=x.dtype)
    h_out = torch.empty(x.shape, device=dev, dtype=x.dtype) if w_next is not None else None
    if rows == 0:
        return x_out, h_out
    block_n, n_rows_prog, num_warps = _launch_shape(n, rows)
    _residual_norm_kernel[(triton.cdiv(rows, n_rows_prog),)](
        x2, y2, w_post, w_post if w_next is None else w_next, x_out,
        x_out if h_out is None else h_out, rows, n, x2.stride(0), y2.stride(0), float(eps),
        HAS_NEXT=w_next is not None, ROWS=n_rows_prog, BLOCK_N=block_n, num_warps=num_warps)
    return x_out, h_out


def residual_rms_norm_ref(x, y, w_post, eps: float, w_next=None):
    """PyTorch twin: the talker's `x + post_norm(y)`, then `pre_norm` of the sum."""
    x = x + rms_norm_ref(y, w_post, eps, plus_one=True, round_first=False)
    h = None if w_next is None else rms_norm_ref(x, w_next, eps, plus_one=True, round_first=False)
    return x, h
