"""Causal ConvNeXt block of the codec, one chunk of T new samples (docs/MODEL.md §2.6 step 2).

Per batch row b (cache row s = slots[b]), channels-last x [T, C]:
    cat = [cache[s] (6 rows); x];  cache[s] <- last 6 rows of cat
    h   = LayerNorm_C(dwconv7(cat) + dw_b) (eps 1e-6, affine)
    y   = x + pwconv2(GELU_exact(pwconv1(h)))          (pwconv1 C->4C, pwconv2 4C->C, with bias)
Fused in Triton: the depthwise conv, its bias and the LayerNorm (one launch, grid (B, T/rows),
each program a sliding 7-row window over its rows of C channels); the cache update is a second
tiny launch (it must not race with the conv's reads of the old cache): `dwconv_ln`. The pointwise convs stay torch
matmuls (TF32 when the caller enables it), `convnext_pointwise`: they are 99% of the FLOPs,
B·T·C·4C·2·2. `convnext_step` is the two in a row.
A Triton matmul with the GELU, pwconv2, bias and residual fused lost to cuBLAS + GELU + add
(docs/FINDINGS.md) and left the tree.
Layouts: x, y [B, T, C] contiguous; cache any strided [S, 6, C] view. Time-major [S, 6, C] has
rows contiguous in C; the codec's CodecState caches are [S, C, 6] (its reference path's layout)
and come in as `.transpose(1, 2)` views, so the engine updates them in place with no relayout
copy, at the price of strided loads of 6·C values per session. Slots int32 or int64 (the
engine's are int64: no cast launch).
Bytes of the fused launch: read x (each row once, plus 6 rows a program from L2) + 6 cache rows,
write h: ≈ 8·B·T·C. The tile kernel (7 tap loads of [BLOCK_T, C] tiles, strided weight loads in
every program) is `window=False`, for A/B runs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from gpu.kernels._check import check, check_index_slots, next_pow2

TAPS = 7
CACHE = TAPS - 1


@triton.jit
def _taps(wt, BLOCK_C: tl.constexpr):
    # The 7 columns of a [BLOCK_C, 8] tile as [BLOCK_C] vectors (register moves: column
    # 4f + 2e + d is the (f, e, d) element of the [2, 2, 2] reshape).
    d0, d1 = tl.split(tl.reshape(wt, [BLOCK_C, 2, 2, 2]))
    e00, e01 = tl.split(d0)
    e10, e11 = tl.split(d1)
    c0, c4 = tl.split(e00)
    c2, c6 = tl.split(e01)
    c1, c5 = tl.split(e10)
    c3, c7 = tl.split(e11)
    return c0, c1, c2, c3, c4, c5, c6


@triton.jit
def _ln_row(acc, mc, ln_w, ln_b, eps, C: tl.constexpr):
    mean = tl.sum(acc, axis=0) / C                            # padded channels hold 0
    dev = tl.where(mc, acc - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(dev * dev, axis=0) / C + eps)
    return dev * rstd * ln_w + ln_b


@triton.jit
def _window_row(xb, cache, s, sc_t, C: tl.constexpr, mc):
    # Row s of [cache (6 rows); x]: from x when s >= 0, else from the cache's row s + 6.
    return tl.where(s >= 0, tl.load(xb + s * C, mask=mc & (s >= 0), other=0.0),
                    tl.load(cache + (s + 6) * sc_t, mask=mc & (s < 0), other=0.0))


@triton.jit
def _dwln_window_kernel(X, CACHE_BUF, SLOTS, DW_W, DW_B, LN_W, LN_B, H, T, ROWS, max_slots, eps,
                        sc_s, sc_t, sc_c, C: tl.constexpr, BLOCK_C: tl.constexpr):
    # grid (B, cdiv(T, ROWS)): rows t0 .. t0+ROWS-1 of one batch row, all C channels, as a
    # sliding 7-row window in registers: each row of x is loaded once (the 6 rows before t0 once
    # per program, from the cache where t < 0), two rows ahead of the one being normalised; the
    # weights once per program as one [C, 8] tile (dw_w's contiguous rows) split into 7 vectors.
    b = tl.program_id(0)
    t0 = tl.program_id(1) * ROWS
    c = tl.arange(0, BLOCK_C)
    mc = c < C
    slot = tl.load(SLOTS + b)
    tl.device_assert((slot >= 0) & (slot < max_slots), "convnext_step: slot out of range")
    cache = CACHE_BUF + slot.to(tl.int64) * sc_s + c * sc_c
    xb = X + b.to(tl.int64) * T * C + c
    hb = H + b.to(tl.int64) * T * C + c
    k = tl.arange(0, 8)[None, :]
    wt = tl.load(DW_W + c[:, None] * 7 + k, mask=mc[:, None] & (k < 7), other=0.0)
    w0, w1, w2, w3, w4, w5, w6 = _taps(wt, BLOCK_C)
    dw_b = tl.load(DW_B + c, mask=mc, other=0.0)
    ln_w = tl.load(LN_W + c, mask=mc, other=0.0)
    ln_b = tl.load(LN_B + c, mask=mc, other=0.0)
    n_rows = tl.minimum(T - t0, ROWS)
    # r0..r5: rows t-6 .. t-1 of [cache; x]; cur: row t; n1: row t+1 (t = t0 at the start).
    r0 = _window_row(xb, cache, t0 - 6, sc_t, C, mc)
    r1 = _window_row(xb, cache, t0 - 5, sc_t, C, mc)
    r2 = _window_row(xb, cache, t0 - 4, sc_t, C, mc)
    r3 = _window_row(xb, cache, t0 - 3, sc_t, C, mc)
    r4 = _window_row(xb, cache, t0 - 2, sc_t, C, mc)
    r5 = _window_row(xb, cache, t0 - 1, sc_t, C, mc)
    cur = tl.load(xb + t0 * C, mask=mc, other=0.0)
    n1 = tl.load(xb + (t0 + 1) * C, mask=mc & (n_rows > 1), other=0.0)
    for i in range(0, n_rows):
        t = t0 + i
        n2 = tl.load(xb + (t + 2) * C, mask=mc & (i + 2 < n_rows), other=0.0)   # in flight meanwhile
        acc = dw_b + w0 * r0
        acc += w1 * r1
        acc += w2 * r2
        acc += w3 * r3
        acc += w4 * r4
        acc += w5 * r5
        acc += w6 * cur
        tl.store(hb + t * C, _ln_row(acc, mc, ln_w, ln_b, eps, C), mask=mc)
        r0, r1, r2, r3, r4, r5, cur, n1 = r1, r2, r3, r4, r5, cur, n1, n2


@triton.jit
def _dwln_kernel(X, CACHE_BUF, SLOTS, DW_W, DW_B, LN_W, LN_B, H, T, max_slots, eps,
                 sc_s, sc_t, sc_c, C: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    b = tl.program_id(0)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.arange(0, BLOCK_C)
    mt = t < T
    mc = c < C
    slot = tl.load(SLOTS + b)
    tl.device_assert((slot >= 0) & (slot < max_slots), "convnext_step: slot out of range")
    cache = CACHE_BUF + slot.to(tl.int64) * sc_s
    xb = X + b.to(tl.int64) * T * C
    acc = tl.zeros([BLOCK_T, BLOCK_C], tl.float32) + tl.load(DW_B + c, mask=mc, other=0.0)[None, :]
    for k in tl.static_range(7):
        src = t + (k - 6)                                     # time index into x; < 0 is cache
        in_x = mt & (src >= 0)
        in_c = mt & (src < 0)
        v = tl.load(xb + src[:, None] * C + c[None, :], mask=in_x[:, None] & mc[None, :], other=0.0)
        v += tl.load(cache + (src + 6)[:, None] * sc_t + c[None, :] * sc_c,
                     mask=in_c[:, None] & mc[None, :], other=0.0)
        acc += tl.load(DW_W + c * 7 + k, mask=mc, other=0.0)[None, :] * v
    mean = tl.sum(acc, axis=1) / C                            # padded channels hold 0
    dev = tl.where(mc[None, :], acc - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(dev * dev, axis=1) / C + eps)
    h = (dev * rstd[:, None] * tl.load(LN_W + c, mask=mc, other=0.0)[None, :]
         + tl.load(LN_B + c, mask=mc, other=0.0)[None, :])
    tl.store(H + b.to(tl.int64) * T * C + t[:, None] * C + c[None, :], h,
             mask=mt[:, None] & mc[None, :])


@triton.jit
def _cache_kernel(X, CACHE_BUF, SLOTS, T, sc_s, sc_t, sc_c, C: tl.constexpr, BLOCK_C: tl.constexpr):
    # grid (B, cdiv(C, BLOCK_C)): cache[s] <- rows T..T+5 of [cache[s]; x]. One load, then one store.
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    i = tl.arange(0, 8)
    mc = c < C
    src = T + i                                               # index into cat; < 6 is old cache
    keep = i < 6
    cache = CACHE_BUF + tl.load(SLOTS + b).to(tl.int64) * sc_s
    from_x = (keep & (src >= 6))[:, None] & mc[None, :]
    from_c = (keep & (src < 6))[:, None] & mc[None, :]
    v = tl.load(X + b.to(tl.int64) * T * C + (src - 6)[:, None] * C + c[None, :], mask=from_x, other=0.0)
    v += tl.load(cache + src[:, None] * sc_t + c[None, :] * sc_c, mask=from_c, other=0.0)
    tl.store(cache + i[:, None] * sc_t + c[None, :] * sc_c, v, mask=keep[:, None] & mc[None, :])


def _check_dwln_args(x, cache, slots, dw_w, dw_b, ln_w, ln_b):
    batch, n_t, n_c = x.shape
    dev, f32 = x.device, torch.float32
    check("x", x, (batch, n_t, n_c), f32, device=dev)
    check("cache", cache, (cache.shape[0], CACHE, n_c), f32, contiguous=False, device=dev)
    check_index_slots(slots, batch, cache.shape[0], dev)
    check("dw_w", dw_w, (n_c, TAPS), f32, device=dev)
    for name, t in (("dw_b", dw_b), ("ln_w", ln_w), ("ln_b", ln_b)):
        check(name, t, (n_c,), f32, device=dev)
    assert n_t >= 1
    return batch, n_t, n_c


def _check_pointwise(x, pw1_w, pw1_b, pw2_w, pw2_b, out):
    n_c, dev, f32 = x.shape[-1], x.device, torch.float32
    check("pw1_w", pw1_w, (4 * n_c, n_c), f32, device=dev)
    check("pw1_b", pw1_b, (4 * n_c,), f32, device=dev)
    check("pw2_w", pw2_w, (n_c, 4 * n_c), f32, device=dev)
    check("pw2_b", pw2_b, (n_c,), f32, device=dev)
    if out is not None:
        check("out", out, tuple(x.shape), f32, device=dev)


def window_rows(n_t: int, rows: int | None = None) -> int:
    """Rows per program of the window kernel: about `rows` (default 16, the fastest of 4/8/16 at
    every codec shape: bench/results/small-kernels-ab-h200.json), balanced over T
    (T = 9: one program; 63: 4 × 16 minus 1; 441: 28 × 16 minus 7)."""
    n_prog = triton.cdiv(n_t, max(1, rows or 16))
    return triton.cdiv(n_t, n_prog)


def dwconv_ln(x, cache, slots, dw_w, dw_b, ln_w, ln_b, *, eps: float = 1e-6, block_elems: int = 2048,
              num_warps: int | None = None, window: bool = True, rows: int | None = None):
    """The fused Triton part: h = LayerNorm(dwconv7([cache; x]) + dw_b) [B, T, C]; updates cache[slots].
    window=True (default): `_dwln_window_kernel`, `rows` consecutive rows a program (None:
    `window_rows`), num_warps None: 4 channels a thread. window=False: the tile kernel (A/B
    baseline, docs/FINDINGS.md), [block_t, C] tiles of block_elems, num_warps None: 4.
    The two differ only in the LayerNorm sums' order (~1e-7)."""
    batch, n_t, n_c = _check_dwln_args(x, cache, slots, dw_w, dw_b, ln_w, ln_b)
    strides = cache.stride()
    h = torch.empty_like(x)
    block_c = next_pow2(n_c)
    if window:
        r = window_rows(n_t, rows)
        _dwln_window_kernel[(batch, triton.cdiv(n_t, r))](
            x, cache, slots, dw_w, dw_b, ln_w, ln_b, h, n_t, r, cache.shape[0], eps, *strides,
            C=n_c, BLOCK_C=block_c, num_warps=num_warps or max(1, min(16, block_c // 128)))
    else:
        block_t = max(1, min(next_pow2(n_t), block_elems // block_c))  # 2048 / 4 warps: no spills
        _dwln_kernel[(batch, triton.cdiv(n_t, block_t))](
            x, cache, slots, dw_w, dw_b, ln_w, ln_b, h, n_t, cache.shape[0], eps, *strides,
            C=n_c, BLOCK_T=block_t, BLOCK_C=block_c, num_warps=num_warps or 4)
    _cache_kernel[(batch, triton.cdiv(n_c, 512))](x, cache, slots, n_t, *strides, C=n_c,
                                                  BLOCK_C=min(512, block_c), num_warps=4)
    return h


def convnext_pointwise(h, x, pw1_w, pw1_b, pw2_w, pw2_b, *, out=None):
    """The torch part: x + pwconv2(GELU_exact(pwconv1(h))) [B, T, C] (into `out` if given), as
    2 addmm + GELU + add."""
    check("h", h, tuple(x.shape), torch.float32, device=x.device)
    _check_pointwise(x, pw1_w, pw1_b, pw2_w, pw2_b, out)
    return _pointwise(h, x, pw1_w, pw1_b, pw2_w, pw2_b, out)


def _pointwise(h, x, pw1_w, pw1_b, pw2_w, pw2_b, out):
    n_c = x.shape[-1]
    u = F.gelu(torch.addmm(pw1_b, h.view(-1, n_c), pw1_w.t()))   # [B*T, 4C]
    if out is None:                 # addmm allocates its output: no separate empty op
        y = torch.addmm(pw2_b, u, pw2_w.t())
    else:
        y = torch.addmm(pw2_b, u, pw2_w.t(), out=out.view(-1, n_c))
    y.add_(x.view(-1, n_c))
    return y.view(x.shape) if out is None else out


def convnext_step(x, cache, slots, dw_w, dw_b, ln_w, ln_b, pw1_w, pw1_b, pw2_w, pw2_b,
                  *, eps: float = 1e-6, out=None, block_elems: int = 2048, num_warps: int | None = None,
                  window: bool = True, rows: int | None = None):
    """x [B, T, C] fp32 -> y [B, T, C] (into `out` if given); cache [S, 6, C] fp32, any strides,
    updated at rows `slots` (int32 or int64 [B]) only. dw_w [C, 7] (the checkpoint's [C, 1, 7]
    squeezed); pw1_w [4C, C], pw2_w [C, 4C] (its [out, in, 1] squeezed). 2 Triton launches +
    2 addmm + GELU + add."""
    _check_pointwise(x, pw1_w, pw1_b, pw2_w, pw2_b, out)        # before the kernels move the cache
    h = dwconv_ln(x, cache, slots, dw_w, dw_b, ln_w, ln_b, eps=eps, block_elems=block_elems,
                  num_warps=num_warps, window=window, rows=rows)
    return _pointwise(h, x, pw1_w, pw1_b, pw2_w, pw2_b, out)


def convnext_step_ref(x, cache, slots, dw_w, dw_b, ln_w, ln_b, pw1_w, pw1_b, pw2_w, pw2_b,
                      *, eps: float = 1e-6, out=None, block_elems: int = 2048, num_warps: int | None = None,
                      window: bool = True, rows: int | None = None):
    """PyTorch twin (same signature), the block as written; the depthwise conv as 7 explicit taps
    (no cuDNN, which may run TF32)."""
    batch, n_t, n_c = x.shape
    f = torch.promote_types(x.dtype, torch.float32)
    idx = slots.long()
    cat = torch.cat([cache[idx].to(f), x.to(f)], dim=1)                    # [B, 6+T, C]
    cache[idx] = cat[:, -CACHE:].to(cache.dtype)
    h = dw_b.to(f) + sum(cat[:, k:k + n_t] * dw_w.to(f)[:, k] for k in range(TAPS))   # [B, T, C]
    h = F.layer_norm(h, (n_c,), ln_w.to(f), ln_b.to(f), eps)
    u = F.gelu(h @ pw1_w.to(f).T + pw1_b.to(f))
    y = (x.to(f) + u @ pw2_w.to(f).T + pw2_b.to(f)).to(x.dtype)
    if out is None:
        return y
    out.copy_(y)
    return out
