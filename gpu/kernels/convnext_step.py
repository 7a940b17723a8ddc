"""Causal ConvNeXt block of the codec, one chunk of T new samples (MODEL.md §2.6 step 2).

Per batch row b (cache row s = slots[b]), channels-last x [T, C]:
    cat = [cache[s] (6 rows); x];  cache[s] <- last 6 rows of cat
    h   = LayerNorm_C(dwconv7(cat) + dw_b) (eps 1e-6, affine)
    y   = x + pwconv2(GELU_exact(pwconv1(h)))          (pwconv1 C->4C, pwconv2 4C->C, with bias)
Fused in Triton: the depthwise conv, its bias and the LayerNorm (one launch, grid (B, T/BLOCK_T),
each program holding whole rows of C channels); the cache update is a second tiny launch (it must
not race with the conv's reads of the old cache): `dwconv_ln`. The pointwise convs stay torch
matmuls (TF32 when the caller enables it), `convnext_pointwise`: they are 99% of the FLOPs,
B·T·C·4C·2·2. `convnext_step` is the two in a row.
Layouts: x, y [B, T, C] contiguous; cache any strided [S, 6, C] view. Time-major [S, 6, C] has
rows contiguous in C; the codec's CodecState caches are [S, C, 6] (its reference path's layout)
and come in as `.transpose(1, 2)` views, so the engine updates them in place with no relayout
copy, at the price of strided loads of 6·C values per session. Slots int32 or int64 (the
engine's are int64: no cast launch).
Bytes of the fused launch: read x (7 taps hit L1/L2) + 6 cache rows, write h: ≈ 8·B·T·C.
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


def dwconv_ln(x, cache, slots, dw_w, dw_b, ln_w, ln_b, *, eps: float = 1e-6, block_elems: int = 2048,
              num_warps: int = 4):
    """The fused Triton part: h = LayerNorm(dwconv7([cache; x]) + dw_b) [B, T, C]; updates cache[slots]."""
    batch, n_t, n_c = _check_dwln_args(x, cache, slots, dw_w, dw_b, ln_w, ln_b)
    strides = cache.stride()
    h = torch.empty_like(x)
    block_c = next_pow2(n_c)
    block_t = max(1, min(next_pow2(n_t), block_elems // block_c))  # 2048 / 4 warps: no spills
    _dwln_kernel[(batch, triton.cdiv(n_t, block_t))](
        x, cache, slots, dw_w, dw_b, ln_w, ln_b, h, n_t, cache.shape[0], eps, *strides,
        C=n_c, BLOCK_T=block_t, BLOCK_C=block_c, num_warps=num_warps)
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
                  *, eps: float = 1e-6, out=None, block_elems: int = 2048, num_warps: int = 4):
    """x [B, T, C] fp32 -> y [B, T, C] (into `out` if given); cache [S, 6, C] fp32, any strides,
    updated at rows `slots` (int32 or int64 [B]) only. dw_w [C, 7] (the checkpoint's [C, 1, 7]
    squeezed); pw1_w [4C, C], pw2_w [C, 4C] (its [out, in, 1] squeezed). 2 Triton launches +
    2 addmm + GELU + add."""
    _check_pointwise(x, pw1_w, pw1_b, pw2_w, pw2_b, out)        # before the kernels move the cache
    h = dwconv_ln(x, cache, slots, dw_w, dw_b, ln_w, ln_b, eps=eps, block_elems=block_elems,
                  num_warps=num_warps)
    return _pointwise(h, x, pw1_w, pw1_b, pw2_w, pw2_b, out)


def convnext_step_ref(x, cache, slots, dw_w, dw_b, ln_w, ln_b, pw1_w, pw1_b, pw2_w, pw2_b,
                      *, eps: float = 1e-6, out=None, block_elems: int = 2048, num_warps: int = 4):
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
