"""Single-query decode attention over a slot-indexed KV cache, split-K (flash-decoding).

For batch row b (state row s = slots[b], valid length n = lengths[b] + length_bias, start =
max(0, n - window) when window > 0 else 0), CFG row r, query head j reading kv head j // (HQ/HKV):
    o[b, r, j] = softmax(q[b, r, j] · K[s, r, kv, start:n]ᵀ · scale) · V[s, r, kv, start:n]
Cache layout [max_slots, R, HKV, max_len, head_dim] (any strides, head_dim contiguous) with q
[B, R, HQ, head_dim]: the R rows (the talker's CFG rows) share a slot and a length but not their
keys, and one launch covers them all. The plain form, q [B, HQ, D] over [max_slots, HKV, max_len,
D], is the same with R = 1. The caller appends this step's K/V before the call. Thinker: HQ 40 /
HKV 8, head_dim 128, bf16, scale 1/√128. Talker: R 2 (reference) or 1 (dense), 16 / 16, head_dim
72 (as 64 + 8 tiles, or one masked 128 tile), fp32 or bf16 KV, scale 1/√256, optional sliding
window; it passes its positions as `lengths` with length_bias 1, which saves the +1 and int32
casts (three launches a layer) that lengths = pos + 1 would cost.
Launch 1, grid (B·R, HKV, splits): each program streams one slice of [start, n) of its kv head
once (all GROUP query heads of the kv head share the read) with an online softmax, and writes a
partial (max, sum, unnormalised acc). GQA (GROUP > 1) uses tl.dot on fp32 operands ("tf32" when q
and KV are 16-bit: exact for q·k; "tf32x3" when any is fp32: ~fp32); MHA (GROUP == 1) uses fp32
multiply-adds with head_dim as 64 + 8 tiles (no idle lanes), or the dot kernel with mha_dot=True.
With 16-bit KV that MHA loop is bound by its per-iteration cross-warp reductions over L (max, sum,
p·V), not by bytes; the lanes kernel (the default on these shapes) keeps one online softmax per L
lane and reduces over L once, after the loop, which brings bf16 close to the byte floor
(bench/results/attn-lanes-h200.json).
Launch 2, grid (B·R, HQ): merges the splits. Bytes: 2·(n - start)·HKV·head_dim·elem per row and
CFG row, plus splits·HQ·(head_dim + 2)·4 of partials.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu.kernels._check import FLOATS, INDEX, check, check_index_slots, next_pow2
from gpu.kernels.decode_attention_mha import (attn_mha_kernel, attn_mha_lanes_kernel,
                                              attn_mha_split_kernel, kv_load, kv_scale_of,
                                              row_bases)
from gpu.kernels.e4m3 import kv_scales
from gpu.model.formats import from_e4m3

LOG2E = 1.4426950408889634


@triton.jit
def _attn_gqa_kernel(Q, K, V, KS, VS, SLOTS, LENS, MP, LP, OP, window, qk_scale, max_slots,
                     length_bias, sq_b, sq_r, sq_h, sk_s, sk_r, sk_h, sv_s, sv_r, sv_h,
                     SK_L: tl.constexpr, SV_L: tl.constexpr, ROWS: tl.constexpr, HQ: tl.constexpr,
                     HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, N_SPLITS: tl.constexpr,
                     BLOCK_G: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr,
                     DOT_PREC: tl.constexpr):
    kh = tl.program_id(1)
    sp = tl.program_id(2)
    row, qp, kp, vp, lo, hi = row_bases(Q, K, V, SLOTS, LENS, kh, sp, window, max_slots,
                                         length_bias, sq_b, sq_r, sk_s, sk_r, sk_h, sv_s, sv_r,
                                         sv_h, ROWS, N_SPLITS, BLOCK_L)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    mg = g < GROUP
    md = d < HEAD_DIM
    heads = kh * GROUP + g
    q = tl.load(qp + heads[:, None] * sq_h + d[None, :], mask=mg[:, None] & md[None, :],
                other=0.0).to(tl.float32) * kv_scale_of(K, KS, kh)
    m_i = tl.full([BLOCK_G], -1e30, tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for l0 in range(lo, hi, BLOCK_L):
        pos = l0 + tl.arange(0, BLOCK_L)
        ml = pos < hi
        kv_mask = ml[:, None] & md[None, :]
        # fp32 operands: with bf16 K/V and q, "tf32" is exact for q·k (8-bit mantissas fit in
        # tf32's 11) and rounds p to tf32 (finer than bf16); the interpreter has no bf16 dot.
        k = kv_load(kp + pos[:, None] * SK_L + d[None, :], kv_mask)
        v = kv_load(vp + pos[:, None] * SV_L + d[None, :], kv_mask)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale     # log2 domain
        s = tl.where(ml[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PREC)
        m_i = m_new
    part = (row * HQ + heads) * N_SPLITS + sp
    tl.store(MP + part, m_i, mask=mg)
    tl.store(LP + part, l_i, mask=mg)
    tl.store(OP + part[:, None] * BLOCK_D + d[None, :], acc * kv_scale_of(V, VS, kh),
             mask=mg[:, None])


@triton.jit
def _combine_kernel(MP, LP, OP, OUT, so_b, so_r, so_h, ROWS: tl.constexpr, HQ: tl.constexpr,
                    HEAD_DIM: tl.constexpr, N_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                    BLOCK_D: tl.constexpr):
    # grid (B·R, HQ): o = Σ_s 2^(m_s - M) acc_s / Σ_s 2^(m_s - M) l_s; an empty row gives 0.
    row = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    ms = s < N_SPLITS
    part = (row * HQ + h) * N_SPLITS + s
    m = tl.load(MP + part, mask=ms, other=-1e30)
    w = tl.where(ms, tl.exp2(m - tl.max(m, axis=0)), 0.0)
    den = tl.sum(w * tl.load(LP + part, mask=ms, other=0.0), axis=0)
    acc = tl.load(OP + part[:, None] * BLOCK_D + d[None, :], mask=ms[:, None] & (d < HEAD_DIM)[None, :],
                  other=0.0)
    o = tl.sum(w[:, None] * acc, axis=0) / tl.where(den > 0.0, den, 1.0)
    out = OUT + (row // ROWS) * so_b + (row % ROWS) * so_r + h * so_h
    tl.store(out + d, o.to(OUT.dtype.element_ty), mask=d < HEAD_DIM)


def _splits(batch: int, hkv: int, max_len: int, device: torch.device) -> int:
    # Enough programs for ~4 per SM, but no split shorter than 128 positions.
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, min(triton.cdiv(4 * sms, batch * hkv), triton.cdiv(max_len, 128)))


def decode_attention(q, k_cache, v_cache, slots, lengths, *, scale: float, window: int = 0,
                     max_len: int | None = None, out=None, num_splits: int | None = None,
                     block_l: int | None = None, num_warps: int = 4, mha_dot: bool = False,
                     split_d: bool = True, length_bias: int = 0, lanes: bool | None = None,
                     kv_scale=None):
    """o [B, HQ, D] (q's dtype) = attention of q [B, HQ, D] over k/v_cache [S, HKV, Lmax, D] rows
    slots (int32|int64 [B]) at positions [max(0, n - window) if window else 0, n), n = lengths
    (int32|int64 [B]) + length_bias. With a rows dim, q [B, R, HQ, D] over k/v_cache
    [S, R, HKV, Lmax, D] → o [B, R, HQ, D], all R rows in the same two launches.
    max_len (host int, ≥ every n) sizes the split grid without reading `lengths`; defaults
    to Lmax. Reads only; the caller writes the new K/V rows first. num_splits/block_l/num_warps
    override the launch shape (defaults: _splits(), BLOCK_L 64, or 32 for the padded MHA kernel;
    4 warps). GROUP == 1 with a non-power-of-two head_dim runs on pow2 + rest tiles (72 = 64 + 8;
    split_d, default: near the byte floor where the padded tile is not,
    bench/results/kernels-h200.json); mha_dot sends GROUP == 1 through the tl.dot kernel
    instead (slower at the model's shapes; kept for other shapes). lanes (GROUP == 1 only) runs
    the per-lane online softmax kernel; None: on for the split_d shapes (faster for bf16 and
    fp32 KV: bench/results/attn-lanes-h200.json), else off. It tiles a power-of-two head_dim as
    two halves. uint8 caches hold fp8 e4m3 bits of K and V divided by kv_scale [2, HKV]."""
    assert q.dim() in (3, 4) and k_cache.dim() == q.dim() + 1, \
        f"q {tuple(q.shape)} with cache {tuple(k_cache.shape)}: expected 3-D/4-D or 4-D/5-D"
    if q.dim() == 4:
        return _decode_attention_rows(q, k_cache, v_cache, slots, lengths, scale, window, max_len,
                                      out, num_splits, block_l, num_warps, mha_dot, split_d,
                                      length_bias, lanes, kv_scale)
    if out is None:
        out = torch.empty_like(q)
    _decode_attention_rows(q[:, None], k_cache[:, None], v_cache[:, None], slots, lengths, scale,
                           window, max_len, out[:, None], num_splits, block_l, num_warps, mha_dot,
                           split_d, length_bias, lanes, kv_scale)
    return out


def _checked(q, k_cache, v_cache, slots, lengths, window, max_len, out, length_bias):
    """The arguments' shapes, dtypes, devices and ranges checked; (max_len, out) settled."""
    batch, rows, hq, head_dim = q.shape
    max_slots, _, hkv, cap, _ = k_cache.shape
    dev = q.device
    check("q", q, (batch, rows, hq, head_dim), FLOATS, device=dev)
    check("k_cache", k_cache, (max_slots, rows, hkv, cap, head_dim), FLOATS + (torch.uint8,),
          contiguous=False, device=dev)
    check("v_cache", v_cache, (max_slots, rows, hkv, cap, head_dim), k_cache.dtype,
          contiguous=False, device=dev)
    assert k_cache.stride(4) == 1 and v_cache.stride(4) == 1, "head_dim must be contiguous"
    assert hq % hkv == 0, (hq, hkv)
    check_index_slots(slots, batch, max_slots, dev)
    check("lengths", lengths, (batch,), INDEX, device=dev)
    max_len = cap if max_len is None else int(max_len)
    assert 1 <= max_len <= cap and int(window) >= 0, (max_len, cap, window)
    if lengths.device.type == "cpu":
        n = [x + int(length_bias) for x in lengths.tolist()]
        assert all(0 <= x <= max_len for x in n), f"lengths {n} (bias {length_bias}) > {max_len}"
    if out is None:
        out = torch.empty_like(q)
    check("out", out, (batch, rows, hq, head_dim), q.dtype, contiguous=False, device=dev)
    assert out.stride(3) == 1, "out: head_dim must be contiguous"
    return max_len, out


def _decode_attention_rows(q, k_cache, v_cache, slots, lengths, scale, window, max_len, out,
                           num_splits, block_l, num_warps, mha_dot, split_d, length_bias, lanes,
                           kv_scale):
    batch, rows, hq, head_dim = q.shape
    max_slots, _, hkv, cap, _ = k_cache.shape
    dev = q.device
    max_len, out = _checked(q, k_cache, v_cache, slots, lengths, window, max_len, out,
                            length_bias)
    ks, vs = kv_scales(kv_scale, k_cache, hkv)
    n_splits = num_splits or _splits(batch * rows, hkv, max_len, dev)
    group, block_d = hq // hkv, next_pow2(head_dim)
    mpart = torch.empty(batch * rows, hq, n_splits, device=dev, dtype=torch.float32)
    lpart = torch.empty_like(mpart)
    opart = torch.empty(batch * rows, hq, n_splits, block_d, device=dev, dtype=torch.float32)
    common = (q, k_cache, v_cache, ks, vs, slots, lengths, mpart, lpart, opart, int(window),
              scale * LOG2E, max_slots, int(length_bias), q.stride(0), q.stride(1), q.stride(2),
              k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
              v_cache.stride(0), v_cache.stride(1), v_cache.stride(2))
    shape = dict(SK_L=k_cache.stride(3), SV_L=v_cache.stride(3), ROWS=rows, HQ=hq, HEAD_DIM=head_dim,
                 N_SPLITS=n_splits, num_warps=num_warps)
    grid = (batch * rows, hkv, n_splits)
    split_shape = split_d and head_dim != block_d
    if lanes is None:
        lanes = split_shape and group == 1 and not mha_dot
    assert not lanes or (group == 1 and not mha_dot and head_dim >= 2), \
        f"lanes: MHA only (GROUP {group}, mha_dot {mha_dot}, head_dim {head_dim})"
    if lanes:
        # pow2 + rest tiles (72 = 64 + 8), or two halves of a power of two: no padded lanes.
        d_a = block_d // 2 if head_dim != block_d else head_dim // 2
        attn_mha_lanes_kernel[grid](*common, BLOCK_L=block_l or 64, BLOCK_D=block_d, D_A=d_a,
                                     D_B=max(2, next_pow2(head_dim - d_a)), **shape)
    elif group > 1 or mha_dot:
        # "tf32" is exact for 16-bit q and K (8-bit mantissas); any fp32 operand needs "tf32x3"
        # (3 tensor-core passes, ~fp32 accuracy), an fp8 cache too (its key scale makes q fp32);
        # the interpreter computes all of them in fp32.
        exact16 = q.dtype != torch.float32 and k_cache.dtype in (torch.bfloat16, torch.float16)
        _attn_gqa_kernel[grid](*common, GROUP=group, BLOCK_G=max(16, next_pow2(group)),
                               BLOCK_L=block_l or 64, BLOCK_D=block_d,
                               DOT_PREC="tf32" if exact16 else "tf32x3", **shape)
    elif split_shape:
        d_a = block_d // 2                                   # largest power of two < head_dim
        attn_mha_split_kernel[grid](*common, BLOCK_L=block_l or 64, BLOCK_D=block_d, D_A=d_a,
                                     D_B=max(2, next_pow2(head_dim - d_a)), **shape)
    else:
        attn_mha_kernel[grid](*common, BLOCK_L=block_l or 32, BLOCK_D=block_d, **shape)
    _combine_kernel[(batch * rows, hq)](mpart, lpart, opart, out, out.stride(0), out.stride(1),
                                        out.stride(2), ROWS=rows, HQ=hq, HEAD_DIM=head_dim,
                                        N_SPLITS=n_splits, BLOCK_S=next_pow2(n_splits),
                                        BLOCK_D=block_d, num_warps=4)
    return out


def decode_attention_ref(q, k_cache, v_cache, slots, lengths, *, scale: float, window: int = 0,
                         max_len: int | None = None, out=None, num_splits: int | None = None,
                         block_l: int | None = None, num_warps: int = 4, mha_dot: bool = False,
                         split_d: bool = True, length_bias: int = 0, lanes: bool | None = None,
                         kv_scale=None):
    """PyTorch twin (same signature; launch shape ignored). fp32 math, fp64 when given fp64.
    The rows form is the plain form once per row."""
    if q.dim() == 4:
        o = torch.stack([decode_attention_ref(q[:, r], k_cache[:, r], v_cache[:, r], slots, lengths,
                                              scale=scale, window=window, max_len=max_len,
                                              length_bias=length_bias, kv_scale=kv_scale)
                         for r in range(q.shape[1])], 1)
        return o if out is None else out.copy_(o)
    batch, hq, head_dim = q.shape
    hkv, cap = k_cache.shape[1], k_cache.shape[2]
    f = torch.promote_types(q.dtype, torch.float32)
    n = cap if max_len is None else int(max_len)
    idx = slots.long()
    k, v = k_cache[idx, :, :n], v_cache[idx, :, :n]                   # [B, HKV, n, D]
    if k_cache.dtype == torch.uint8:                                  # fp8 e4m3 bits
        k = from_e4m3(k) * kv_scale[0, :, None, None]
        v = from_e4m3(v) * kv_scale[1, :, None, None]
    k, v = k.to(f), v.to(f)
    qq = q.to(f).reshape(batch, hkv, hq // hkv, head_dim)             # head j -> kv head j // G
    s = torch.einsum("bhgd,bhld->bhgl", qq, k) * scale
    pos = torch.arange(n, device=q.device)[None, :]
    lens = lengths.long()[:, None] + length_bias
    start = (lens - window).clamp_min(0) if window > 0 else torch.zeros_like(lens)
    valid = (pos < lens) & (pos >= start)                             # [B, n]
    p = torch.softmax(s.masked_fill(~valid[:, None, None, :], float("-inf")), dim=-1).nan_to_num(0.0)
    o = torch.einsum("bhgl,bhld->bhgd", p, v).reshape(batch, hq, head_dim).to(q.dtype)
    if out is None:
        return o
    out.copy_(o)
    return out
