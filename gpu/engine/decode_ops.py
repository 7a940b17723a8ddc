"""The engine's fast decode path: the reference modules' per-frame state updates done by the
Triton kernels in place on slot-indexed state, instead of gather → compute → scatter.

The reference model calls these through its `decode_ops` hooks (thinker `_run` on a decode step,
talker `DecoderLayer` on a one-position step, the MoG head's mixture choice); with the hooks
unset it runs its own plain PyTorch. What moves per session-frame (docs/MODEL.md §5):
  - Mamba2: the fp32 SSM state is read and written once (283 MB over 27 layers) instead of
    being copied out, updated and copied back (three times the traffic);
  - attention: only the first `length` positions of a slot's KV are read, not the allocated
    capacity (the talker's fp32 CFG cache is 504 KB per past frame).
The talker's attention block is launch-bound (28 layers, a few µs of GPU time per launch in a
graph whatever its size), so its decode step runs in 4 launches a layer: one matmul for q, k and
v, one kernel for both head norms, RoPE and the K/V write, and one launch pair of attention over
all CFG rows. The reference takes 25 with CFG (23 without): 3 matmuls, 2 norms, 8 RoPE ops, 2
index writes (+ 2 casts to a bf16 cache), 3 ops for int32 slots and lengths, and per CFG row a q
copy (with CFG) and an attention pair, then a stack.
The codec (`Codec.step`'s hook) runs channels-last [B, T, C]. The reference works [B, C, T] and
pays, per ConvNeXt block, a cache gather, a cat, cuDNN's depthwise conv, transposes around a
separate LayerNorm and an index write back: its non-matmul part is most of the codec's
per-session cost. Here each Upsample is one matmul whose output already is the next
layer's [B, T·k, C] input, and each block one Triton launch (depthwise conv + bias + LayerNorm,
reading the [S, C, 6] cache in place) and one for the cache update, around the two pointwise
matmuls.
Perception's rel-pos attention (`RelPosAttention.stream`'s hook) reads each row's K/V ring in
place at its slot, all F queries of the step at once, in one launch a layer: the reference
gathers the rings ([B, H, 72, 128] each, copied out every layer of every frame) and runs
~15 more launches a layer around them. The rest of a perception layer is launch-bound too (~750
launches a step, a few KB each): each of its four residual adds and the LayerNorm after it are one
kernel (`perception_add_norm`; the last also does the next layer's first LayerNorm), and q, k, v
one matmul (`perception_qkv`): 29 launches a layer → 22.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpu.kernels.convnext_step import convnext_pointwise, dwconv_ln
from gpu.kernels.decode_attention import decode_attention
from gpu.kernels.gelu_mul import gelu_mul
from gpu.kernels.layer_norm import add_layer_norm
from gpu.kernels.mamba_step import mamba_step
from gpu.kernels.mog_sample import mog_sample
from gpu.kernels.qk_norm_rope import qk_norm_rope
from gpu.kernels.relpos_attention import relpos_attention
from gpu.kernels.rms_norm import residual_rms_norm, rms_norm
from gpu.model import thinker
from gpu.model.codec import Codec, CodecState, ConvNeXtBlock, Upsample
from gpu.model.talker import text as talker_text


def _layer_scale(state, layer: int) -> Tensor | None:
    """An fp8 talker cache's scales [2, kv_heads] for `layer` (None for other caches)."""
    return None if state.kv_scale is None else state.kv_scale[layer]


class TritonDecodeOps:
    """Install with `install(model)`; every method matches the reference math it replaces."""

    def mamba(self, mixer, u: Tensor, conv: Tensor, ssm: Tensor, slots: Tensor,
              round_key: tuple | None = None) -> Tensor:
        """u [B, 1, H]; conv [S, conv_dim, 3] and ssm [S, h, p, n] (fp32 or bf16) updated in
        place; `round_key` (length [S], layer): a bf16 state rounded stochastically."""
        c = mixer.cfg
        z, xbc, dt = mixer._split(u[:, 0])
        y = mamba_step(xbc.contiguous(), z.contiguous(), dt.contiguous(), conv, ssm,
                       slots.to(torch.int32), mixer.conv1d.weight.view(c.conv_dim, c.conv_kernel),
                       mixer.conv1d.bias, mixer.dt_bias, mixer.A_log, mixer.D, mixer.norm.weight,
                       ngroups=c.n_groups, eps=c.eps, round_key=round_key)
        return mixer.out_proj(y)[:, None]

    def thinker_attention(self, attn, u: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor,
                          length: Tensor) -> Tensor:
        """u [B, 1, H]; k/v_cache [S, P + 1, kv, dh] (last row: trash); the new row is written
        at `length` first, then attended over positions [0, length]."""
        c = attn.cfg
        q, k, v = attn._qkv(u)
        trash = k_cache.shape[1] - 1
        write = torch.where(length < trash, length, trash)
        k_cache[slots, write] = k[:, 0]
        v_cache[slots, write] = v[:, 0]
        o = decode_attention(q[:, 0].contiguous(), k_cache.permute(0, 2, 1, 3),
                             v_cache.permute(0, 2, 1, 3), slots.to(torch.int32),
                             (length + 1).to(torch.int32), scale=1.0 / math.sqrt(c.head_dim))
        return attn.o_proj(o.flatten(-2))[:, None]

    def perception_attention(self, attn, q: Tensor, k_ring: Tensor, v_ring: Tensor, slots: Tensor,
                             frames: Tensor) -> Tensor:
        """A perception layer's streaming attention before linear_out: q [B, F, H, dh] of the
        step's frames frames[b] + f over the rings k/v_ring [S, H, R, dh] (the step's rows
        already written) at slots → o [B, F, H, dh]."""
        c = attn.cfg
        return relpos_attention(q.contiguous(), k_ring, v_ring, slots, frames, attn.stream_pos,
                                attn.pos_bias_u, attn.pos_bias_v, left_context=c.left_context,
                                scale=1.0 / math.sqrt(c.head_dim))

    def perception_qkv(self, attn, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v [B, F, H, dh] of a perception layer's normed rows u [B, F, D] in one matmul
        over [W_q; W_k; W_v] (made at install): views into its [B, F, 3·D] output."""
        qkv = F.linear(u, *fused_perception_qkv(attn))
        return qkv.unflatten(-1, (3, attn.cfg.n_heads, attn.cfg.head_dim)).unbind(-3)

    def perception_add_norm(self, x: Tensor, y: Tensor, alpha: float, norm: nn.LayerNorm,
                            norm2: nn.LayerNorm | None = None):
        """A Conformer sublayer boundary in one launch: (s = x + alpha·y, norm(s), norm2 of that
        or None), as `ConformerLayer._add_norm` computes them."""
        second = () if norm2 is None else (norm2.weight, norm2.bias, norm2.eps)
        return add_layer_norm(x, y, alpha, norm.weight, norm.bias, norm.eps, *second)

    def mog_choice(self, logits: Tensor, uniforms: Tensor, top_p: float) -> Tensor:
        """The MoG head's mixture: top-p filter and Gumbel-max in one launch (one row per
        program, a sort in registers) → int32 [B]. Same rule as top_p_filter + gumbel_choice;
        where probabilities tie exactly, the lower index is kept first (a stable sort). Under
        Triton's interpreter (CPU tensors) the pairwise form, the same rule without a sort: the
        interpreter's sort costs it seconds a row (both forms are checked against the reference
        in tests/kernels/test_kernels_mog.py)."""
        return mog_sample(logits.float().contiguous(), uniforms.contiguous(), top_p=top_p,
                          algo="sort" if logits.is_cuda else "pairwise")

    def talker_qkv_attention(self, layer, h: Tensor, pos: Tensor, state, slots: Tensor,
                             frame) -> Tensor:
        """The talker DecoderLayer's attention block on a one-position step: normed input
        h [B, R, 1, H] at positions pos [B, 1] → [B, R, 1, Hq·D] (fp32); writes the layer's K/V
        rows at pos first, as the reference does."""
        q = self.talker_qkv(layer, h, pos, state, slots, frame)
        return self.talker_attention(q, state.k[:, layer.index], state.v[:, layer.index], slots,
                                     pos, layer.window, layer.cfg.attn_scale,
                                     _layer_scale(state, layer.index))

    def talker_qkv(self, layer, h: Tensor, pos: Tensor, state, slots: Tensor, frame) -> Tensor:
        """h [B, R, 1, H] → q [B, R, 1, Hq, D] normed and rotated (fp32); k normed and rotated and
        v written at [slots, layer, :, :, pos] of the state. Two launches: the fused qkv matmul
        and qk_norm_rope (on the frame's cos/sin for the layer's θ)."""
        cfg, att = layer.cfg, layer.self_attn
        qkv = F.linear(h[:, :, 0], fused_qkv_weight(att))          # [B, R, (Hq + 2·Hkv)·D]
        width = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        q, k, v = qkv.split([width[0], width[1], width[1]], -1)
        cos, sin = frame.cos_sin[layer.theta]                       # [B, 1, 1, D/2]
        q = qk_norm_rope(q, k, v, att.q_norm.weight, att.k_norm.weight, cos[:, 0, 0], sin[:, 0, 0],
                         slots, pos[:, 0], state.k[:, layer.index], state.v[:, layer.index],
                         eps=cfg.rms_eps, kv_scale=_layer_scale(state, layer.index))
        return q[:, :, None]

    def talker_attention(self, q: Tensor, k_layer: Tensor, v_layer: Tensor, slots: Tensor,
                         pos: Tensor, window: int | None, scale: float,
                         kv_scale: Tensor | None = None) -> Tensor:
        """q [B, R, 1, Hq, D] at positions pos [B, 1], over k/v_layer [S, R, Hkv, P, D] whose
        rows up to pos are written → [B, R, 1, Hq·D] (fp32, as the reference). One launch pair
        for all CFG rows; slots and pos go in as they are (int32 or int64): the kernel reads
        pos + 1 as the length."""
        o = decode_attention(q[:, :, 0].float().contiguous(), k_layer, v_layer, slots, pos[:, 0],
                             scale=scale, window=window or 0, length_bias=1, kv_scale=kv_scale)
        return o.flatten(-2)[:, :, None]

    def codec_step(self, codec: Codec, state: CodecState, codes: Tensor, slots: Tensor) -> Tensor:
        """`Codec.step` channels-last: codes int [B, Q] of the sessions at `slots` [B] (int32 or
        int64) → pcm fp32 [B, 1764]; the ConvNeXt caches and spectra of those slots updated as
        the reference updates them, other slots untouched."""
        x = codec.latent(codes[:, None]).transpose(1, 2)           # [B, 1, D], contiguous
        caches = iter(state.conv)
        for layer in codec.decoder.layers[:-1]:
            if isinstance(layer, ConvNeXtBlock):
                h = self.codec_dwconv_ln(layer, x, next(caches).transpose(1, 2), slots)
                x = convnext_pointwise(h, x, layer.pwconv1.weight[..., 0], layer.pwconv1.bias,
                                       layer.pwconv2.weight[..., 0], layer.pwconv2.bias)
            else:
                x = _upsample(layer, x)
        params = F.linear(x, codec.decoder.layers[-1].weight[..., 0])   # [B, 441, 18]
        return codec.stream_pcm(state, codec.to_spectra(params.transpose(1, 2)), slots)

    def codec_dwconv_ln(self, block: ConvNeXtBlock, x: Tensor, cache: Tensor, slots: Tensor) -> Tensor:
        """A ConvNeXt block's Triton part, 2 launches: h = LayerNorm(dwconv7([cache; x]) + bias)
        [B, T, C] from x [B, T, C]; cache [S, 6, C] (any strides) updated at `slots`. A method of
        its own so that a stand-in can replace the kernels alone (bench/op_census.py).
        Compiled, the sliding-window form (the faster one); under Triton's interpreter (CPU
        tensors) the tile form: the interpreter runs a program's operations one at a time, and the
        window form's row loop costs it 3 to 6 times as long. Both are checked against the reference
        and each other in tests/kernels/test_kernels_convnext.py."""
        return dwconv_ln(x, cache, slots, block.dwconv.weight[:, 0], block.dwconv.bias,
                         block.norm.weight, block.norm.bias, eps=block.norm.eps,
                         window=x.is_cuda)


def _upsample(up: Upsample, x: Tensor) -> Tensor:
    # x [B, T, C_in] → [B, T·k, C_out]: row b·T + t of the product holds samples t·k .. t·k + k − 1.
    c_in, c_out, _ = up.weight.shape
    return torch.mm(x.view(-1, c_in), upsample_matrix(up)).view(x.shape[0], -1, c_out)


def fused_qkv_weight(att: nn.Module) -> Tensor:
    """[W_q; W_k; W_v] [(Hq + 2·Hkv)·D, H] of a talker DecoderAttention, for one matmul in place
    of three (`fused_rows_weight`, kept as `att.qkv_weight`)."""
    return fused_rows_weight(att, (att.q_proj, att.k_proj, att.v_proj), "qkv_weight")


def fused_perception_qkv(attn: nn.Module) -> tuple[Tensor, Tensor | None]:
    """[W_q; W_k; W_v] [3·D, D] of a perception RelPosAttention and their biases [3·D] (None
    without: the real model has none), as `fused_rows_weight`: `attn.qkv_weight`, `attn.qkv_bias`."""
    lin = (attn.linear_q, attn.linear_k, attn.linear_v)
    bias = None if lin[0].bias is None else fused_rows_weight(attn, lin, "qkv_bias", "bias")
    return fused_rows_weight(attn, lin, "qkv_weight"), bias


def fused_gate_up_weight(mlp: nn.Module) -> Tensor:
    """[W_gate; W_up] [2·I, H] of a talker GatedMLP (`fused_rows_weight`, `mlp.gate_up_weight`)."""
    return fused_rows_weight(mlp, (mlp.gate_proj, mlp.up_proj), "gate_up_weight")


def fused_rows_weight(module: nn.Module, linears: tuple[nn.Linear, ...], name: str,
                      attr: str = "weight") -> Tensor:
    """The weights of `linears` (same input width) stacked by rows, for one matmul in place of
    several (attr="bias": their biases, the same way). Made once and kept as the non-persistent
    buffer `module.<name>`, with the linears' weights turned into views of it: no second copy
    (446 MB for the full fp32 talker's qkv alone), and an in-place load writes through. A load
    that assigns new tensors (load_talker does) or a move breaks the views; that is noticed here
    and the buffer made again."""
    fused = getattr(module, name, None)
    parts = [getattr(p, attr) for p in linears]
    if fused is not None and _views_into(fused, parts):
        return fused
    _outside_capture(name)
    with torch.no_grad():
        fused = torch.cat(parts)
        start = 0
        for p, w in zip(linears, parts):
            rows = w.shape[0]
            setattr(p, attr, nn.Parameter(fused[start:start + rows], requires_grad=w.requires_grad))
            start += rows
    module.register_buffer(name, fused, persistent=False)
    return fused


def _gated_mlp(mlp: nn.Module, x: Tensor) -> Tensor:
    # 3 launches instead of 5: [gate; up] in one matmul, GELU·up in one kernel, then down.
    return mlp.down_proj(gelu_mul(F.linear(x, fused_gate_up_weight(mlp))))


def _outside_capture(what: str) -> None:
    # A weight buffer made inside a CUDA-graph capture would be replayed from weights since freed.
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{what}: made during a graph capture; call install() first")


def upsample_matrix(up: Upsample) -> Tensor:
    """The codec Upsample's ConvTranspose weight [C_in, C_out, k] as W' [C_in, k·C_out], column
    j·C_out + o = weight[:, o, j]: x [B·T, C_in] @ W' is then [B, T·k, C_out] as it lies. Kept
    like `fused_qkv_weight`: the non-persistent buffer `up.matrix`, with `up.weight` made a view
    of it (strides (k·C_out, 1, C_out)), so no second copy and an in-place load writes through;
    a load that assigns new tensors or a move breaks the view, and the buffer is made again."""
    mat = getattr(up, "matrix", None)
    if mat is not None and _is_upsample_view(up.weight, mat):
        return mat
    _outside_capture("upsample_matrix")
    w = up.weight
    c_in, c_out, k = w.shape
    with torch.no_grad():
        mat = w.permute(0, 2, 1).reshape(c_in, k * c_out).contiguous()
        up.weight = nn.Parameter(mat.view(c_in, k, c_out).permute(0, 2, 1),
                                 requires_grad=w.requires_grad)
    up.register_buffer("matrix", mat, persistent=False)
    return mat


def _is_upsample_view(w: Tensor, mat: Tensor) -> bool:
    # Host metadata only, as _views_into.
    c_in, c_out, k = w.shape
    return (w.device == mat.device and w.dtype == mat.dtype and mat.shape == (c_in, k * c_out)
            and w.stride() == (k * c_out, 1, c_out) and mat.is_contiguous()
            and w.data_ptr() == mat.data_ptr())


def _views_into(fused: Tensor, weights: list[Tensor]) -> bool:
    # Host metadata only (pointers, strides): no device work on the per-frame path.
    row = fused.stride(0) * fused.element_size()
    start = 0
    for w in weights:
        if (w.device != fused.device or w.dtype != fused.dtype or w.stride() != fused.stride()
                or w.shape[1:] != fused.shape[1:] or w.data_ptr() != fused.data_ptr() + start * row):
            return False
        start += w.shape[0]
    return start == fused.shape[0]


# One launch per RMSNorm instead of ~7 elementwise/reduction kernels: the talker alone runs ~200
# norms a frame (6 per layer, 7 per MoG pass), which made it launch-bound at small batches.
def _fused_norm(x: Tensor, weight: Tensor, eps: float, plus_one: bool, round_first: bool) -> Tensor:
    # The talker's warm-up normalises a transposed batch: one copy still beats seven launches.
    return rms_norm(x if x.is_contiguous() else x.contiguous(), weight, eps, plus_one=plus_one,
                    round_first=round_first)


_FUSED_NORMS = {
    talker_text.RMSNorm: functools.partial(_fused_norm, plus_one=True, round_first=False),
    thinker.RMSNorm: functools.partial(_fused_norm, plus_one=False, round_first=True),
}


def _fused_residual(x: Tensor, y: Tensor, w_post: Tensor, eps: float, w_next: Tensor | None):
    return residual_rms_norm(x if x.is_contiguous() else x.contiguous(),
                             y if y.is_contiguous() else y.contiguous(), w_post, eps, w_next)


def install(model, ops: TritonDecodeOps | None = None) -> None:
    """Route the model's decode steps, perception attention, codec frames, RMSNorms (with the
    talker's residual steps) and the talker's gated MLPs through the kernels (`ops`; None
    restores the reference path everywhere)."""
    model.thinker.decode_ops = ops
    install_perception(model.perception, ops)
    install_talker(model.talker, ops)
    model.codec.decode_ops = ops
    for layer in model.codec.decoder.layers:
        if ops is not None and isinstance(layer, Upsample):
            upsample_matrix(layer)
    for module in model.modules():
        fused = _FUSED_NORMS.get(type(module))
        if fused is not None:
            module.fused = fused if ops is not None else None


def install_perception(perception: nn.Module, ops: TritonDecodeOps | None) -> None:
    """The perception's part of `install`: every Conformer layer's residual adds with their
    LayerNorms and its streaming attention; the fused qkv weights are made now, not on the first
    frame, which may be a graph capture."""
    for layer in perception.encoder.layers:
        layer.decode_ops = layer.self_attn.decode_ops = ops
        if ops is not None:
            fused_perception_qkv(layer.self_attn)


def install_talker(talker: nn.Module, ops: TritonDecodeOps | None) -> None:
    """The talker's part of `install` (its RMSNorms excepted): the attention and MoG hooks, the
    residual steps and the gated MLPs; fused weights are made now, not on the first frame, which
    may be a graph capture."""
    talker.tts_model.mog_head.decode_ops = ops
    for layer in talker.tts_model.backbone.layers:
        layer.decode_ops = ops
        if ops is not None:
            fused_qkv_weight(layer.self_attn)
    for module in talker.modules():
        if isinstance(module, talker_text.RMSNorm):
            module.fused_residual = _fused_residual if ops is not None else None
        if isinstance(module, talker_text.GatedMLP):
            if ops is not None:
                fused_gate_up_weight(module)
            module.fused = _gated_mlp if ops is not None else None
