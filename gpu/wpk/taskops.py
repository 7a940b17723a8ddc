"""The task ops beyond the GEMM and the add + norm (issue 18, stage 2): what the rest of a traced
stage needs to run whole as one task-table program — pointwise ops, copies, gathers and
scatters, row softmax, batched GEMMs on strided operands, and direct convolutions of one input
channel a group. Every body is `noinline` (WPK.md §3) and reads its argument record, `ARGS`
int32 words (`gpu.wpk.taskrun`); every tensor is an fp32 offset into the arena. Integer and
boolean tensors are held there as fp32 values (exact below 2²⁴; booleans as 0 and 1).

- `EW`: out[i] = f(A[i], B[i], C[i]) over a rank-4 iteration space (leading extents 1), a tile
  `EW_TILE` of its elements. Each operand is an offset and four strides (0: broadcast); an
  operand's offset -1 makes it a scalar (A: `sa`, B: `sb`; C is always a tensor). Up to three
  index terms each add `mult · idx[i]` to the out's or A's address (idx a tensor of the arena,
  read at its own strides): a gather (`index_select`, `gather`, `index`) indexes A, a scatter
  (`index_put_`, `index_copy_`) indexes out. Record words: `EW_WORDS`.
- `SOFTMAX`: y = softmax(x) over dense rows of D ≤ `SM_MAX_D`; record x, y, rows, D.
- `BGEMM`: C[b] = A[b] @ B[b] (+ bias) with every operand at its own batch, row and column
  strides, from the fp32 arena (`bmm`; a 1 × 1 convolution as positions × channels); fp32 in
  full (`ieee`); a tile runs its row and column block for one or more batches. Record:
  `BGEMM_WORDS`.
- `CONV`: y[n, co, h, w] = bias[co] + Σ_{kh, kw} w[co, kh, kw] · x[n, ci(co), h·sh + kh,
  w·sw + kw], one input channel a group (ci = co // co_per_ci: depthwise, or one input
  channel), no padding (the trace pads with its own nodes); y dense. Record: `CONV_WORDS`.
"""
from __future__ import annotations

import triton
import triton.language as tl

EW, SOFTMAX, BGEMM, CONV = 4, 5, 6, 7
C_EW, C_SOFTMAX, C_BGEMM, C_CONV = (tl.constexpr(v) for v in (EW, SOFTMAX, BGEMM, CONV))

# EW's functions: A, B and C are the operands' values (a scalar where the operand is one).
EW_FN = {"copy": 0, "add": 1, "sub": 2, "rsub": 3, "mul": 4, "div": 5, "silu": 6, "relu": 7,
         "sigmoid": 8, "neg": 9, "exp": 10, "tanh": 11, "sqrt": 12, "rsqrt": 13, "where": 14,
         "eq": 15, "ne": 16, "le": 17, "lt": 18, "ge": 19, "gt": 20, "not": 21, "or": 22,
         "and": 23, "remainder": 24, "iota": 25, "glu": 26, "abs": 27, "clamp": 28}
# Record words of EW: fn, n0..n3, out (offset, 4 strides), A, B, C (each the same), sa, sb
# (clamp: its bounds), alpha (add and sub: A ± alpha·B; rsub: B - alpha·A) as fp32 bits, then three index terms of
# 7 words: target (0 out, 1 A, -1 none), idx offset, 4 strides, mult.
EW_WORDS = 1 + 4 + 4 * 5 + 3 + 3 * 7
EW_OUT, EW_A, EW_B, EW_C, EW_SCALARS, EW_TERMS = 5, 10, 15, 20, 25, 28
C_OUT, C_A, C_B, C_C, C_SCALARS, C_TERMS = (tl.constexpr(v) for v in (
    EW_OUT, EW_A, EW_B, EW_C, EW_SCALARS, EW_TERMS))
EW_BLOCK, EW_STEPS = 1024, 8
EW_TILE = EW_BLOCK * EW_STEPS           # elements a tile
C_EWB, C_EWS = tl.constexpr(EW_BLOCK), tl.constexpr(EW_STEPS)
SM_TILE_M, SM_MAX_D = 4, 1024
C_SMM, C_SMD = tl.constexpr(SM_TILE_M), tl.constexpr(SM_MAX_D)
# BGEMM: a, a_sb, a_sm, a_sk, b, b_sb, b_sk, b_sn, c, c_sb, c_sm, c_sn, batches, M, N, K,
# bias (-1: none), bias_sm, bias_sn, batches a tile (a small product is one tile of many
# batches, not a task each).
BGEMM_WORDS = 20
BG_TILE_M, BG_TILE_N, BG_TILE_K = 16, 64, 32
BG_BATCHES = 8
C_BM, C_BN, C_BK = (tl.constexpr(v) for v in (BG_TILE_M, BG_TILE_N, BG_TILE_K))
# CONV: x, x_sn, x_sc, x_sh, x_sw, w, bias (-1: none), y, N, Co, Ho, Wo, KH, KW, sh, sw,
# co_per_ci.
CONV_WORDS = 17
CONV_BLOCK, CONV_STEPS = 512, 8
CONV_TILE = CONV_BLOCK * CONV_STEPS     # outputs a tile
C_CB, C_CS = tl.constexpr(CONV_BLOCK), tl.constexpr(CONV_STEPS)


@triton.jit
def words10(rec):
    """An argument record's first ten words, in order."""
    return (tl.load(rec), tl.load(rec + 1), tl.load(rec + 2), tl.load(rec + 3), tl.load(rec + 4),
            tl.load(rec + 5), tl.load(rec + 6), tl.load(rec + 7), tl.load(rec + 8),
            tl.load(rec + 9))


@triton.jit
def _bits(rec, word):
    return tl.load(rec + word).to(tl.float32, bitcast=True)


@triton.jit
def _unravel(lin, n1, n2, n3):
    """The 4-D index (i0, i1, i2, i3) of linear index `lin` in row-major extents (_, n1, n2,
    n3)."""
    q = lin // n3
    r = q // n2
    return r // n1, r % n1, q % n2, lin % n3


@triton.jit
def _place(arena, rec, base, which, i0, i1, i2, i3):
    """The address of the operand whose words start at `base` (its index terms target
    `which`) at the index (i0..i3)."""
    at = tl.load(rec + base) + i0 * tl.load(rec + base + 1) + i1 * tl.load(rec + base + 2) \
        + i2 * tl.load(rec + base + 3) + i3 * tl.load(rec + base + 4)
    for j in tl.static_range(3):
        t = rec + C_TERMS + 7 * j
        if tl.load(t) == which:
            io = tl.load(t + 1) + i0 * tl.load(t + 2) + i1 * tl.load(t + 3) \
                + i2 * tl.load(t + 4) + i3 * tl.load(t + 5)
            at += tl.load(arena + io).to(tl.int32) * tl.load(t + 6)
    return at


@triton.jit
def _operand(arena, rec, base, which, scalar, i0, i1, i2, i3, mask):
    if tl.load(rec + base) >= 0:
        v = tl.load(arena + _place(arena, rec, base, which, i0, i1, i2, i3), mask=mask,
                    other=0.0)
    else:
        v = tl.zeros([C_EWB], tl.float32) + scalar
    return v


@triton.jit
def _ew_fn(fn, a, b, c, alpha, lo, hi):
    if fn == 0:
        r = a
    elif fn == 1:
        r = a + alpha * b
    elif fn == 2:
        r = a - alpha * b
    elif fn == 3:
        r = b - alpha * a
    elif fn == 4:
        r = a * b
    elif fn == 5:
        r = a / b
    elif fn == 6:
        r = a / (1.0 + tl.exp(-a))
    elif fn == 7:
        r = tl.maximum(a, 0.0)
    elif fn == 8:
        r = 1.0 / (1.0 + tl.exp(-a))
    elif fn == 9:
        r = -a
    elif fn == 10:
        r = tl.exp(a)
    elif fn == 11:
        r = 2.0 / (1.0 + tl.exp(-2.0 * a)) - 1.0
    elif fn == 12:
        r = tl.sqrt(a)
    elif fn == 13:
        r = 1.0 / tl.sqrt(a)
    elif fn == 14:
        r = tl.where(c != 0.0, a, b)
    elif fn == 15:
        r = tl.where(a == b, 1.0, 0.0)
    elif fn == 16:
        r = tl.where(a != b, 1.0, 0.0)
    elif fn == 17:
        r = tl.where(a <= b, 1.0, 0.0)
    elif fn == 18:
        r = tl.where(a < b, 1.0, 0.0)
    elif fn == 19:
        r = tl.where(a >= b, 1.0, 0.0)
    elif fn == 20:
        r = tl.where(a > b, 1.0, 0.0)
    elif fn == 21:
        r = tl.where(a != 0.0, 0.0, 1.0)
    elif fn == 22:
        r = tl.where((a != 0.0) | (b != 0.0), 1.0, 0.0)
    elif fn == 23:
        r = tl.where((a != 0.0) & (b != 0.0), 1.0, 0.0)
    elif fn == 27:
        r = tl.abs(a)
    elif fn == 28:          # between the scalars sa (low) and sb (high)
        r = tl.minimum(tl.maximum(a, lo), hi)
    elif fn == 26:          # B: the second half of A's last dimension
        r = a / (1.0 + tl.exp(-b))
    elif fn == 24:          # Python's remainder: the sign of the divisor
        r = a - tl.floor(a / b) * b
        r = tl.where((r != 0.0) & ((r < 0.0) != (b < 0.0)), r + b, r)
        r = tl.where((b > 0.0) & (r >= b), r - b, r)
    else:
        r = a
    return r


@triton.jit(noinline=True)
def ew_tile(arena, rec, tile):
    fn = tl.load(rec)
    n1 = tl.load(rec + 2)
    n2 = tl.load(rec + 3)
    n3 = tl.load(rec + 4)
    total = tl.load(rec + 1) * n1 * n2 * n3
    sa = _bits(rec, C_SCALARS)
    sb = _bits(rec, C_SCALARS + 1)
    alpha = _bits(rec, C_SCALARS + 2)
    steps = tl.minimum(C_EWS, (total - tile * C_EWS * C_EWB + C_EWB - 1) // C_EWB)
    for s in range(0, steps):
        lin = (tile * C_EWS + s) * C_EWB + tl.arange(0, C_EWB)
        mask = lin < total
        i0, i1, i2, i3 = _unravel(lin, n1, n2, n3)
        if fn == 25:
            r = sa + lin.to(tl.float32) * sb
        else:
            a = _operand(arena, rec, C_A, 1, sa, i0, i1, i2, i3, mask)
            b = _operand(arena, rec, C_B, 2, sb, i0, i1, i2, i3, mask)
            c = _operand(arena, rec, C_C, 3, 0.0, i0, i1, i2, i3, mask)
            r = _ew_fn(fn, a, b, c, alpha, sa, sb)
        tl.store(arena + _place(arena, rec, C_OUT, 0, i0, i1, i2, i3), r, mask=mask)


@triton.jit(noinline=True)
def softmax_tile(arena, rec, tile):
    x = tl.load(rec)
    y = tl.load(rec + 1)
    m_rows = tl.load(rec + 2)
    d = tl.load(rec + 3)
    rm = tile * C_SMM + tl.arange(0, C_SMM)
    rd = tl.arange(0, C_SMD)
    mask = (rm[:, None] < m_rows) & (rd[None, :] < d)
    at = rm[:, None] * d + rd[None, :]
    v = tl.load(arena + x + at, mask=mask, other=float("-inf"))
    e = tl.exp(v - tl.max(v, axis=1)[:, None])
    e = tl.where(mask, e, 0.0)
    tl.store(arena + y + at, e / tl.sum(e, axis=1)[:, None], mask=mask)


@triton.jit(noinline=True)
def bgemm_tile(arena, rec, tile):
    a, a_sb, a_sm, a_sk, b, b_sb, b_sk, b_sn, c, c_sb = words10(rec)
    c_sm = tl.load(rec + 10)
    c_sn = tl.load(rec + 11)
    m_rows = tl.load(rec + 13)
    n_cols = tl.load(rec + 14)
    k_dim = tl.load(rec + 15)
    bias = tl.load(rec + 16)
    per_tile = tl.load(rec + 19)
    tiles_m = (m_rows + C_BM - 1) // C_BM
    tiles_n = (n_cols + C_BN - 1) // C_BN
    first = (tile // (tiles_m * tiles_n)) * per_tile
    t = tile % (tiles_m * tiles_n)
    rm = (t // tiles_n) * C_BM + tl.arange(0, C_BM)
    rn = (t % tiles_n) * C_BN + tl.arange(0, C_BN)
    for batch in range(first, tl.minimum(first + per_tile, tl.load(rec + 12))):
        a_b = a + batch * a_sb
        b_b = b + batch * b_sb
        acc = tl.zeros([C_BM, C_BN], tl.float32)
        for k0 in tl.range(0, k_dim, C_BK, num_stages=1):
            rk = k0 + tl.arange(0, C_BK)
            # each tile loaded with its unit-stride dimension last (coalesced), then turned
            if a_sm == 1:
                x = tl.trans(tl.load(arena + a_b + rk[:, None] * a_sk + rm[None, :],
                                     mask=(rk[:, None] < k_dim) & (rm[None, :] < m_rows),
                                     other=0.0))
            else:
                x = tl.load(arena + a_b + rm[:, None] * a_sm + rk[None, :] * a_sk,
                            mask=(rm[:, None] < m_rows) & (rk[None, :] < k_dim), other=0.0)
            if b_sk == 1:
                w = tl.trans(tl.load(arena + b_b + rn[:, None] * b_sn + rk[None, :],
                                     mask=(rn[:, None] < n_cols) & (rk[None, :] < k_dim),
                                     other=0.0))
            else:
                w = tl.load(arena + b_b + rk[:, None] * b_sk + rn[None, :] * b_sn,
                            mask=(rk[:, None] < k_dim) & (rn[None, :] < n_cols), other=0.0)
            acc = tl.dot(x, w, acc, input_precision="ieee")
        if bias >= 0:
            acc += tl.load(arena + bias + rm[:, None] * tl.load(rec + 17)
                           + rn[None, :] * tl.load(rec + 18),
                           mask=(rm[:, None] < m_rows) & (rn[None, :] < n_cols), other=0.0)
        tl.store(arena + c + batch * c_sb + rm[:, None] * c_sm + rn[None, :] * c_sn, acc,
                 mask=(rm[:, None] < m_rows) & (rn[None, :] < n_cols))


@triton.jit(noinline=True)
def conv_tile(arena, rec, tile):
    x, x_sn, x_sc, x_sh, x_sw, w, bias, y, n_batch, co_n = words10(rec)
    ho = tl.load(rec + 10)
    wo = tl.load(rec + 11)
    kh = tl.load(rec + 12)
    kw = tl.load(rec + 13)
    sh = tl.load(rec + 14)
    sw = tl.load(rec + 15)
    co_per_ci = tl.load(rec + 16)
    total = n_batch * co_n * ho * wo
    steps = tl.minimum(C_CS, (total - tile * C_CS * C_CB + C_CB - 1) // C_CB)
    for s in range(0, steps):
        lin = (tile * C_CS + s) * C_CB + tl.arange(0, C_CB)
        mask = lin < total
        n, co, oh, ow = _unravel(lin, co_n, ho, wo)
        base = x + n * x_sn + (co // co_per_ci) * x_sc + oh * sh * x_sh + ow * sw * x_sw
        acc = tl.zeros([C_CB], tl.float32)
        if bias >= 0:
            acc += tl.load(arena + bias + co, mask=mask, other=0.0)
        for tap in range(0, kh * kw):
            dh = tap // kw
            dw = tap % kw
            wv = tl.load(arena + w + co * kh * kw + tap, mask=mask, other=0.0)
            acc += wv * tl.load(arena + base + dh * x_sh + dw * x_sw, mask=mask, other=0.0)
        tl.store(arena + y + lin, acc, mask=mask)
