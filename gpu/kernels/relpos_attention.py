"""Perception's streaming Transformer-XL attention over its K/V rings, in one launch a layer.

For batch row b (slot s = slots[b], step start frame n = frames[b]), query f < F at frame
m = n + f, head h and ring row i < R (docs/MODEL.md §2.2; `RelPosAttention.stream` is the reference):
    dist(m, i) = (m − i) mod R                      ring row i holds frame m − dist
    visible    = dist ≤ left_context and dist ≤ m   (no frame before the session's first)
    s_i = ((q + u_h)·K[s, h, i] + (q + v_h)·stream_pos[R − 1 − dist, h]) · scale
    o[b, f, h] = softmax_visible(s) · V[s, h]
with q = q[b, f, h]; u, v the pos_bias_u/v rows. All of it in fp32 whatever the operand dtype
(the reference rounds its bf16 products to bf16), the output in q's dtype.
Why: the reference gathers each row's rings (index_select of K and V: [B, H, R, dh] copied out,
in each of 24 layers every frame) and then spends ~15 more launches a layer (bias adds, 3
batched matmuls and their copies, the distance gather, scale, mask, softmax, casts). Here the
rings are read in place at the slot, once for all F queries, and all of it is one launch.
Grid (B, H): one program per (row, head) holds the ring's K and V tiles [next_pow2(R),
next_pow2(dh)] (72 x 128 → 128 x 128: the padding rows are masked, never read) and, per query,
gathers the stream_pos rows of each ring row's distance. The ring is short (R = 72), so the
softmax is a plain one over a single tile. Products are elementwise multiplies + tl.sum: exact
fp32 (no TF32), and there is no M ≥ 16 to fill a tensor-core dot with F ≤ 2 queries.
Bytes per (b, h): the visible ring rows of K and V (≤ 2·R·dh·elem; rows nobody sees, e.g. a
session's first frames, are masked off), F·R·dh·elem of stream_pos (one [R, H, dh] table per
layer, shared by every row, so L2-resident), 2·F·dh·elem of q and o, 2·dh·elem of biases.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu.kernels._check import FLOATS, INDEX, check, check_index_slots, next_pow2
from gpu.kernels.rms_norm import _rows_view

LOG2E = 1.4426950408889634


@triton.jit
def _visible(m, r, R: tl.constexpr, W: tl.constexpr):
    # dist of ring row r for a query at frame m ≥ 0; (m mod R) − r + R > 0 for every r < R.
    dist = ((m % R).to(tl.int32) - r + R) % R
    return dist, (r < R) & (dist <= W) & (dist <= m)


@triton.jit
def _relpos_attention_kernel(Q, K, V, SLOTS, FRAMES, POS, BU, BV, O, qk_scale, max_slots, sq,
                             sk_s, sk_h, sk_r, sv_s, sv_h, sv_r,
                             N_F: tl.constexpr, H: tl.constexpr, HEAD_DIM: tl.constexpr,
                             R: tl.constexpr, W: tl.constexpr, BLOCK_R: tl.constexpr,
                             BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(SLOTS + b).to(tl.int64)
    n = tl.load(FRAMES + b).to(tl.int64)
    tl.device_assert((slot >= 0) & (slot < max_slots), "relpos_attention: slot out of range")
    tl.device_assert(n >= 0, "relpos_attention: negative frame")
    r = tl.arange(0, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    md = d < HEAD_DIM
    seen = r < 0                            # rows some query of the step sees: all that is read
    for f in tl.static_range(N_F):
        _, vis = _visible(n + f, r, R, W)
        seen = seen | vis
    mk = seen[:, None] & md[None, :]
    # K and V stay in their own dtype while held (a bf16 128 x 128 tile is 32 registers a thread
    # at 8 warps, fp32 64): each product widens its operand as it goes
    k = tl.load(K + slot * sk_s + h * sk_h + r[:, None] * sk_r + d[None, :], mask=mk,
                other=0.0)                                                  # [BLOCK_R, BLOCK_D]
    v = tl.load(V + slot * sv_s + h * sv_h + r[:, None] * sv_r + d[None, :], mask=mk,
                other=0.0)
    bu = tl.load(BU + h * HEAD_DIM + d, mask=md, other=0.0).to(tl.float32)
    bv = tl.load(BV + h * HEAD_DIM + d, mask=md, other=0.0).to(tl.float32)
    for f in tl.static_range(N_F):
        dist, vis = _visible(n + f, r, R, W)
        row = ((b * N_F + f) * H + h) * HEAD_DIM                            # o [B, F, H, dh]
        q = tl.load(Q + (b * N_F + f) * sq + h * HEAD_DIM + d, mask=md, other=0.0).to(tl.float32)
        # stream_pos [R, H, dh] lists distances R − 1 … 0 (derive_stream_pos)
        p = tl.load(POS + (R - 1 - dist)[:, None] * (H * HEAD_DIM) + h * HEAD_DIM + d[None, :],
                    mask=vis[:, None] & md[None, :], other=0.0)
        s = (tl.sum(k.to(tl.float32) * (q + bu)[None, :], axis=1)
             + tl.sum(p.to(tl.float32) * (q + bv)[None, :], axis=1))
        # dist 0 (the query's own frame) is always visible: the max is finite, the sum ≥ 1
        s = tl.where(vis, s * qk_scale, float("-inf"))
        e = tl.exp2(s - tl.max(s, axis=0))
        o = tl.sum(e[:, None] * v.to(tl.float32), axis=0) / tl.sum(e, axis=0)
        tl.store(O + row + d, o.to(O.dtype.element_ty), mask=md)


def _check_args(q, k_ring, v_ring, slots, frames, stream_pos, bias_u, bias_v, left_context, out):
    batch, n_f, heads, dh = q.shape
    max_slots, _, rows, _ = k_ring.shape
    dev = q.device
    check("q", q, (batch, n_f, heads, dh), FLOATS, contiguous=False, device=dev)
    check("k_ring", k_ring, (max_slots, heads, rows, dh), q.dtype, contiguous=False, device=dev)
    check("v_ring", v_ring, (max_slots, heads, rows, dh), q.dtype, contiguous=False, device=dev)
    assert k_ring.stride(3) == 1 and v_ring.stride(3) == 1, "k/v_ring: head_dim must be contiguous"
    check_index_slots(slots, batch, max_slots, dev)
    check("frames", frames, (batch,), INDEX, device=dev)
    if frames.device.type == "cpu":
        assert all(x >= 0 for x in frames.tolist()), f"frames {frames.tolist()}: negative"
    check("stream_pos", stream_pos, (rows, heads, dh), FLOATS, device=dev)
    check("bias_u", bias_u, (heads, dh), FLOATS, device=dev)
    check("bias_v", bias_v, (heads, dh), FLOATS, device=dev)
    # the step's F rows are written before the call; they must evict nothing its first query sees
    assert 0 <= left_context and left_context + n_f <= rows, \
        f"left_context {left_context} + {n_f} frames > ring rows {rows}"
    if out is not None:
        check("out", out, (batch, n_f, heads, dh), q.dtype, device=dev)


def relpos_attention(q, k_ring, v_ring, slots, frames, stream_pos, bias_u, bias_v, *,
                     left_context: int, scale: float, out=None, num_warps: int | None = None):
    """o [B, F, H, dh] (q's dtype) = the rel-pos attention (top comment) of q [B, F, H, dh]
    (B·F rows of contiguous H·dh at one row stride: q may be a slice of a fused qkv) over the
    rings k_ring, v_ring [S, H, R, dh] (q's dtype, any strides with dh contiguous) at slots
    (int32|int64 [B]); frames (int32|int64 [B]) the frame of each row's first query;
    stream_pos [R, H, dh], bias_u, bias_v [H, dh] contiguous. Reads only: the caller writes
    the step's K/V rows first. num_warps: 4 by default (faster than 8 at the model's shape:
    bench/results/relpos-ab-h200.json)."""
    _check_args(q, k_ring, v_ring, slots, frames, stream_pos, bias_u, bias_v, left_context, out)
    batch, n_f, heads, dh = q.shape
    rows = k_ring.shape[2]
    q_rows = _rows_view(q, heads * dh)                                      # [B·F, H·dh]
    if out is None:
        out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    block_r, block_d = next_pow2(rows), next_pow2(dh)
    _relpos_attention_kernel[(batch, heads)](
        q, k_ring, v_ring, slots, frames, stream_pos, bias_u, bias_v, out, scale * LOG2E,
        k_ring.shape[0], q_rows.stride(0), k_ring.stride(0), k_ring.stride(1), k_ring.stride(2),
        v_ring.stride(0), v_ring.stride(1), v_ring.stride(2),
        N_F=n_f, H=heads, HEAD_DIM=dh, R=rows, W=int(left_context), BLOCK_R=block_r,
        BLOCK_D=block_d, num_warps=num_warps or 4)
    return out


def relpos_attention_ref(q, k_ring, v_ring, slots, frames, stream_pos, bias_u, bias_v, *,
                         left_context: int, scale: float, out=None, num_warps: int | None = None):
    """PyTorch twin (same signature; num_warps ignored), the math of `RelPosAttention.stream`
    step by step: gather the rows' rings, scores in the compute dtype, softmax in fp32."""
    n_f, rows = q.shape[1], k_ring.shape[2]
    k, v = k_ring.index_select(0, slots), v_ring.index_select(0, slots)     # [B, H, R, dh]
    frame = frames.long()[:, None] + torch.arange(n_f, device=q.device)    # [B, F]
    dist = torch.remainder(frame[:, :, None] - torch.arange(rows, device=q.device), rows)
    visible = (dist <= left_context) & (dist <= frame[:, :, None])         # [B, F, R]
    qh = q.transpose(1, 2)                                                  # [B, H, F, dh]
    ac = (qh + bias_u[:, None]) @ k.transpose(-1, -2)                       # [B, H, F, R]
    bd = torch.einsum("bhqd,khd->bhqk", qh + bias_v[:, None], stream_pos)  # distance order
    bd = bd.gather(-1, (rows - 1 - dist)[:, None].expand(*ac.shape))       # → ring order
    s = ((ac + bd).float() * scale).masked_fill(~visible[:, None], float("-inf"))
    o = (s.softmax(-1).to(v.dtype) @ v).transpose(1, 2).to(q.dtype)         # [B, F, H, dh]
    return o if out is None else out.copy_(o)
