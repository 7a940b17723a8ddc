"""The talker's per-frame q/k head norms, RoPE and KV-cache write, in one launch.

For batch row b (slot s = slots[b], position p = pos[b]), CFG row r and head h, in fp32:
    n(x, w)  = x · rsqrt(Σx²/D + eps) · (1 + w)                    talker.text.RMSNorm
    rope(y)  = [y1·cos − y2·sin | y2·cos + y1·sin]                 y = [y1 | y2], halves of D
               cos/sin = cos/sin(p · inv_freq) [D/2]               talker.text.rope_cos_sin
    q_out[b, r, h]          = rope(n(q[b, r, h], w_q))             returned, fp32
    k_layer[s, r, h, p, :]  = rope(n(k[b, r, h], w_k))             in the cache dtype
    v_layer[s, r, h, p, :]  = v[b, r, h]
The op order is the reference's (norm: (x·rs)·(1 + w); rope: apply_rope_tables' products, whose
x1·cos + x2·(−sin) is x1·cos − x2·sin exactly); only the order of the Σx² reduction differs (and,
compiled, fused multiply-adds): inside 1e-5 relative in fp32. A bf16 cache gets round-to-nearest-
even done in integer bits (`_round_bf16`: the interpreter's fp32->bf16 cast truncates); an fp8
cache (uint8) gets the e4m3 bits of the value divided by its layer's per-head scale, made the
same way (`e4m3_encode`: the same bits as torch's cast).
On the talker's decode path this replaces, per layer and frame, the 2 norm launches, 8 RoPE
launches (4 each for q and k) and the 2 cache index-writes (plus their casts for a bf16 cache).
Layout: q [B, R, Hq·D], k and v [B, R, Hkv·D] fp32 with unit stride in the last dim and any strides
in B and R, so they can be column slices of one fused qkv matmul [B, R, (Hq + 2·Hkv)·D];
cos/sin [B, D/2] fp32 (unit stride in D/2); slots and pos int32|int64 [B]; k_layer, v_layer
[S, R, Hkv, P, D] fp32|bf16|uint8, any strides with D contiguous (a layer of the talker's state).
Grid (B·R,): one program per (batch row, CFG row) does all heads, each half of D as a
[heads, next_pow2(D/2)] tile (D = 72: 36 of 64 lanes; the kernel is launch-bound, ~3·1152 values
a program). Bytes per (b, r): read (Hq + 2·Hkv)·D·4 + D·4 (cos/sin), write Hq·D·4 + 2·Hkv·D·(4|2).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu.kernels._check import INDEX, check, check_index_slots, next_pow2
from gpu.kernels.e4m3 import e4m3_encode, kv_scales
from gpu.kernels.rms_norm import _round_bf16
from gpu.model.formats import to_e4m3
from gpu.model.talker.text import RMSNorm, apply_rope_tables, rope_tables

CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.uint8)      # uint8: fp8 e4m3 bits
WEIGHT_DTYPES = (torch.float32, torch.bfloat16)


@triton.jit
def _load_halves(X, heads, mh, c, mc, stride_h, HALF: tl.constexpr):
    # [heads, BLOCK_C] tiles of both halves of each head's D values; padding lanes read 0.
    ptr = X + heads[:, None] * stride_h + c[None, :]
    m = mh[:, None] & mc[None, :]
    x1 = tl.load(ptr, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=m, other=0.0).to(tl.float32)
    return x1, x2


@triton.jit
def _store_halves(X, heads, mh, c, mc, stride_h, y1, y2, HALF: tl.constexpr):
    ptr = X + heads[:, None] * stride_h + c[None, :]
    m = mh[:, None] & mc[None, :]
    tl.store(ptr, y1, mask=m)
    tl.store(ptr + HALF, y2, mask=m)


@triton.jit
def _norm_rope(x1, x2, W, c, mc, cos, sin, eps, HALF: tl.constexpr):
    # Padding lanes hold 0, so they add nothing to Σx²; w is loaded per half like x.
    rs = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
    w1 = 1.0 + tl.load(W + c, mask=mc, other=0.0).to(tl.float32)
    w2 = 1.0 + tl.load(W + HALF + c, mask=mc, other=0.0).to(tl.float32)
    y1 = x1 * rs[:, None] * w1[None, :]
    y2 = x2 * rs[:, None] * w2[None, :]
    return y1 * cos[None, :] - y2 * sin[None, :], y2 * cos[None, :] + y1 * sin[None, :]


@triton.jit
def _to_cache(y, CACHE, SCALE, hk, mhk):
    # fp8 caches hold e4m3 bits of y / the head's scale (SCALE: [HKV] of this layer)
    if CACHE.dtype.element_ty == tl.uint8:
        scale = tl.load(SCALE + hk, mask=mhk, other=1.0)
        return e4m3_encode(y / scale[:, None])
    if CACHE.dtype.element_ty == tl.bfloat16:
        y = _round_bf16(y)
    return y.to(CACHE.dtype.element_ty)


@triton.jit
def _qk_norm_rope_kernel(Q, K, V, WQ, WK, COS, SIN, SLOTS, POS, KL, VL, KS, VS, QO, eps, max_slots,
                         max_pos, sq_b, sq_r, sk_b, sk_r, sv_b, sv_r, scs_b,
                         skl_s, skl_r, skl_h, skl_p, svl_s, svl_r, svl_h, svl_p,
                         ROWS: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
                         HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr,
                         BLOCK_C: tl.constexpr):
    row = tl.program_id(0)                                  # b·ROWS + r
    b = row // ROWS
    r = row % ROWS
    slot = tl.load(SLOTS + b).to(tl.int64)
    p = tl.load(POS + b).to(tl.int64)
    tl.device_assert((slot >= 0) & (slot < max_slots), "qk_norm_rope: slot out of range")
    tl.device_assert((p >= 0) & (p < max_pos), "qk_norm_rope: position out of range")
    c = tl.arange(0, BLOCK_C)
    mc = c < HALF
    cos = tl.load(COS + b * scs_b + c, mask=mc, other=0.0)
    sin = tl.load(SIN + b * scs_b + c, mask=mc, other=0.0)

    hq = tl.arange(0, BLOCK_HQ)
    mhq = hq < HQ
    q1, q2 = _load_halves(Q + b * sq_b + r * sq_r, hq, mhq, c, mc, 2 * HALF, HALF)
    q1, q2 = _norm_rope(q1, q2, WQ, c, mc, cos, sin, eps, HALF)
    _store_halves(QO + row * (HQ * 2 * HALF), hq, mhq, c, mc, 2 * HALF, q1, q2, HALF)

    hk = tl.arange(0, BLOCK_HKV)
    mhk = hk < HKV
    k1, k2 = _load_halves(K + b * sk_b + r * sk_r, hk, mhk, c, mc, 2 * HALF, HALF)
    k1, k2 = _norm_rope(k1, k2, WK, c, mc, cos, sin, eps, HALF)
    k_at = KL + slot * skl_s + r * skl_r + p * skl_p
    _store_halves(k_at, hk, mhk, c, mc, skl_h, _to_cache(k1, KL, KS, hk, mhk),
                  _to_cache(k2, KL, KS, hk, mhk), HALF)

    v1, v2 = _load_halves(V + b * sv_b + r * sv_r, hk, mhk, c, mc, 2 * HALF, HALF)
    v_at = VL + slot * svl_s + r * svl_r + p * svl_p
    _store_halves(v_at, hk, mhk, c, mc, svl_h, _to_cache(v1, VL, VS, hk, mhk),
                  _to_cache(v2, VL, VS, hk, mhk), HALF)


def _check_args(q, k, v, q_weight, k_weight, cos, sin, slots, pos, k_layer, v_layer):
    max_slots, rows, hkv, max_pos, d = k_layer.shape
    batch, dev = q.shape[0], q.device
    assert d % 2 == 0, f"head_dim {d} must be even (RoPE rotates halves)"
    check("q", q, (batch, rows, None), torch.float32, contiguous=False, device=dev)
    assert q.shape[2] % d == 0, f"q: width {q.shape[2]} is not a multiple of head_dim {d}"
    for name, t in (("k", k), ("v", v)):
        check(name, t, (batch, rows, hkv * d), torch.float32, contiguous=False, device=dev)
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert t.stride(2) == 1, f"{name}: last dim must have stride 1 (strides {t.stride()})"
    check("q_weight", q_weight, (d,), WEIGHT_DTYPES, device=dev)
    check("k_weight", k_weight, (d,), WEIGHT_DTYPES, device=dev)
    for name, t in (("cos", cos), ("sin", sin)):
        check(name, t, (batch, d // 2), torch.float32, contiguous=False, device=dev)
    assert cos.stride() == sin.stride() and cos.stride(1) == 1, \
        f"cos/sin: need equal strides, unit in D/2 ({cos.stride()}, {sin.stride()})"
    check_index_slots(slots, batch, max_slots, dev)
    check("pos", pos, (batch,), INDEX, device=dev)
    if pos.device.type == "cpu":
        vals = pos.tolist()
        assert all(0 <= x < max_pos for x in vals), f"pos {vals} out of range [0, {max_pos})"
    check("k_layer", k_layer, (max_slots, rows, hkv, max_pos, d), CACHE_DTYPES, contiguous=False,
          device=dev)
    check("v_layer", v_layer, (max_slots, rows, hkv, max_pos, d), k_layer.dtype, contiguous=False,
          device=dev)
    assert k_layer.stride(4) == 1 and v_layer.stride(4) == 1, "k/v_layer: head_dim must be contiguous"


def qk_norm_rope(q, k, v, q_weight, k_weight, cos, sin, slots, pos, k_layer, v_layer, *,
                 eps: float, kv_scale=None):
    """Normalise and rotate q [B, R, Hq·D] and k [B, R, Hkv·D]; write k and v [B, R, Hkv·D] at
    [slots[b], r, :, pos[b]] of k_layer / v_layer [S, R, Hkv, P, D]; return q as a new contiguous
    fp32 [B, R, Hq, D]. q_weight, k_weight [D] are the norms' w (scale 1 + w); cos/sin [B, D/2].
    uint8 caches hold fp8 e4m3 bits of k and v divided by kv_scale [2, Hkv] (keys, values).
    See the top comment for the math and the accepted layouts."""
    _check_args(q, k, v, q_weight, k_weight, cos, sin, slots, pos, k_layer, v_layer)
    max_slots, rows, hkv, max_pos, d = k_layer.shape
    batch, hq = q.shape[0], q.shape[2] // d
    ks, vs = kv_scales(kv_scale, k_layer, hkv)
    out = torch.empty(batch, rows, hq, d, device=q.device, dtype=torch.float32)
    if batch == 0:
        return out
    _qk_norm_rope_kernel[(batch * rows,)](
        q, k, v, q_weight, k_weight, cos, sin, slots, pos, k_layer, v_layer, ks, vs, out, float(eps),
        max_slots, max_pos, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), cos.stride(0),
        k_layer.stride(0), k_layer.stride(1), k_layer.stride(2), k_layer.stride(3),
        v_layer.stride(0), v_layer.stride(1), v_layer.stride(2), v_layer.stride(3),
        ROWS=rows, HQ=hq, HKV=hkv, HALF=d // 2, BLOCK_HQ=next_pow2(hq), BLOCK_HKV=next_pow2(hkv),
        BLOCK_C=next_pow2(d // 2), num_warps=4)
    return out


def _model_norm(x, weight, eps: float):
    # The talker's own RMSNorm module (never the engine's fused one: a fresh instance).
    norm = RMSNorm(weight.shape[0], eps).to(weight.device)
    norm.weight = torch.nn.Parameter(weight, requires_grad=False)
    return norm(x)


def qk_norm_rope_ref(q, k, v, q_weight, k_weight, cos, sin, slots, pos, k_layer, v_layer, *,
                     eps: float, kv_scale=None):
    """PyTorch twin (same signature), through the talker's own RMSNorm and `apply_rope_tables`;
    writes k_layer / v_layer with an index write as the reference layer does."""
    batch, rows = q.shape[:2]
    hkv, d = k_layer.shape[2], k_layer.shape[4]
    tables = rope_tables(cos[:, None], sin[:, None])              # [B, 1, 1, D]: rows, heads
    q_out = apply_rope_tables(_model_norm(q.reshape(batch, rows, -1, d), q_weight, eps), tables)
    k_out = apply_rope_tables(_model_norm(k.reshape(batch, rows, hkv, d), k_weight, eps), tables)
    dev = q.device
    at = (slots.long()[:, None, None], torch.arange(rows, device=dev)[None, :, None],
          torch.arange(hkv, device=dev)[None, None, :], pos.long()[:, None, None])
    v_out = v.reshape(batch, rows, hkv, d)
    if k_layer.dtype == torch.uint8:
        k_layer[at] = to_e4m3(k_out / kv_scale[0, :, None])
        v_layer[at] = to_e4m3(v_out / kv_scale[1, :, None])
    else:
        k_layer[at] = k_out.to(k_layer.dtype)
        v_layer[at] = v_out.to(v_layer.dtype)
    return q_out.contiguous()
