"""The engine's fast decode path: the reference modules' per-frame state updates done by the
Triton kernels in place on slot-indexed state, instead of gather → compute → scatter.

The reference model calls these through its `decode_ops` hooks (thinker `_run` on a decode step,
talker `DecoderLayer` on a one-position step); with the hooks unset it runs its own plain
PyTorch. What moves per session-frame (MODEL.md §5):
  - Mamba2: the fp32 SSM state is read and written once (283 MB over 27 layers) instead of
    being copied out, updated and copied back (three times the traffic);
  - attention: only the first `length` positions of a slot's KV are read, not the allocated
    capacity (the talker's fp32 CFG cache is 504 KB per past frame).
"""
from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from gpu.kernels.decode_attention import decode_attention
from gpu.kernels.mamba_step import mamba_step
from gpu.kernels.rms_norm import rms_norm
from gpu.model import talker_text, thinker


class TritonDecodeOps:
    """Install with `install(model)`; every method matches the reference math it replaces."""

    def mamba(self, mixer, u: Tensor, conv: Tensor, ssm: Tensor, slots: Tensor) -> Tensor:
        """u [B, 1, H]; conv [S, conv_dim, 3] and ssm [S, h, p, n] fp32 updated in place."""
        c = mixer.cfg
        z, xbc, dt = mixer._split(u[:, 0])
        y = mamba_step(xbc.contiguous(), z.contiguous(), dt.contiguous(), conv, ssm,
                       slots.to(torch.int32), mixer.conv1d.weight.view(c.conv_dim, c.conv_kernel),
                       mixer.conv1d.bias, mixer.dt_bias, mixer.A_log, mixer.D, mixer.norm.weight,
                       ngroups=c.n_groups, eps=c.eps)
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

    def talker_attention(self, q: Tensor, k_layer: Tensor, v_layer: Tensor, slots: Tensor,
                         pos: Tensor, window: int | None, scale: float) -> Tensor:
        """q [B, R, 1, Hq, D] at positions pos [B, 1], over k/v_layer [S, R, Hkv, P, D] whose
        rows up to pos are written → [B, R, 1, Hq·D] (fp32, as the reference)."""
        lengths = (pos[:, 0] + 1).to(torch.int32)
        slots32 = slots.to(torch.int32)
        rows = []
        for r in range(q.shape[1]):            # one launch per CFG row (the rows' KV interleave)
            o = decode_attention(q[:, r, 0].float().contiguous(), k_layer[:, r], v_layer[:, r],
                                 slots32, lengths, scale=scale, window=window or 0)
            rows.append(o.flatten(-2))
        return torch.stack(rows, 1)[:, :, None]


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


def install(model, ops: TritonDecodeOps | None = None) -> None:
    """Route the model's decode steps and RMSNorms through the kernels (`ops`; None restores the
    reference path everywhere)."""
    model.thinker.decode_ops = ops
    for layer in model.talker.tts_model.backbone.layers:
        layer.decode_ops = ops
    for module in model.modules():
        fused = _FUSED_NORMS.get(type(module))
        if fused is not None:
            module.fused = fused if ops is not None else None
