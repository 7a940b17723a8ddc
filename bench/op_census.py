"""Kernel launches per frame, stage by stage, on the engine's path, without a GPU.

The full model runs on the meta device (shapes only: no memory, no arithmetic) under a dispatch
mode that counts every aten op that launches work (views are free). The engine's Triton kernels
cannot run there, so their hooks are replaced by shape-only stand-ins that count their real
number of launches. A CUDA-graph replay pays ~2-3 µs per launch on the H200, so at small batch
these counts are most of each stage's fixed cost (README, "What bounds it").

    python3 bench/op_census.py [--sessions 8] [--profile reference] [--rows 8]
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.graph_stages import PER_BEAT, stage_fns                    # noqa: E402
from gpu.engine import decode_ops                                      # noqa: E402
from gpu.model.config import Profile, VoiceChatConfig                 # noqa: E402
from gpu.model.talker import text as talker_text                      # noqa: E402
from gpu.model.voicechat import VoiceChat                             # noqa: E402
from gpu.model.voicechat_weights import load_dtype, param_shapes       # noqa: E402

FREE = {"view", "_unsafe_view", "expand", "t", "transpose", "permute", "unsqueeze", "squeeze",
        "select", "slice", "detach", "alias", "as_strided", "split", "chunk", "unbind",
        "split_with_sizes", "unflatten", "flatten"}


class _Census(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.stage = "?"
        self.counts: collections.Counter = collections.Counter()
        self.quiet = 0            # > 0 inside a stand-in: its shape-making ops are not launches

    def launch(self, name: str, n: int = 1) -> None:
        self.counts[(self.stage, name)] += n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in FREE and not self.quiet:
            self.launch(name)
        return out


class _StandIns(decode_ops.TritonDecodeOps):
    """The decode kernels' output shapes, counted as their launches (see decode_ops)."""

    def __init__(self, census: _Census):
        self.census = census

    def _empty(self, *shape, like, dtype=None):
        self.census.quiet += 1
        try:
            return torch.empty(*shape, device=like.device, dtype=dtype or like.dtype)
        finally:
            self.census.quiet -= 1

    def mamba(self, mixer, u, conv, ssm, slots, round_key=None):
        self.census.launch("triton mamba_step (conv, ssm, norm)", 3)
        return mixer.out_proj(self._empty(u.shape[0], mixer.cfg.d_inner, like=u))[:, None]

    def thinker_attention(self, attn, u, k_cache, v_cache, slots, length):
        self.census.launch("triton decode_attention (+ combine)", 2)
        q, k, v = attn._qkv(u)
        k_cache[slots, length] = k[:, 0]
        v_cache[slots, length] = v[:, 0]
        return attn.o_proj(self._empty(u.shape[0], q.shape[-2] * q.shape[-1], like=u))[:, None]

    def perception_attention(self, attn, q, k_ring, v_ring, slots, frames):
        self.census.launch("triton relpos_attention", 1)
        return self._empty(*q.shape, like=q)

    def perception_add_norm(self, x, y, alpha, norm, norm2=None):
        self.census.launch("triton add_layer_norm", 1)
        s, u = self._empty(*x.shape, like=x), self._empty(*x.shape, like=x)
        return s, u, None if norm2 is None else self._empty(*x.shape, like=x)

    def mog_choice(self, logits, uniforms, top_p):
        self.census.launch("triton mog_sample", 1)
        return self._empty(logits.shape[0], like=logits, dtype=torch.int32)

    def talker_qkv(self, layer, h, pos, state, slots, frame):
        self.census.launch("triton qk_norm_rope", 1)
        cfg = layer.cfg
        torch.nn.functional.linear(h[:, :, 0], decode_ops.fused_qkv_weight(layer.self_attn))
        return self._empty(h.shape[0], h.shape[1], 1, cfg.n_heads, cfg.head_dim, like=h)

    def talker_attention(self, q, k_layer, v_layer, slots, pos, window, scale, kv_scale=None):
        self.census.launch("triton decode_attention (+ combine)", 2)      # all CFG rows
        return self._empty(q.shape[0], q.shape[1], 1, q.shape[3] * q.shape[4], like=q)

    def codec_dwconv_ln(self, block, x, cache, slots):
        self.census.launch("triton convnext dwconv_ln (+ cache)", 2)
        return self._empty(*x.shape, like=x)


def census(sessions: int, profile: str, config: str = "full") -> collections.Counter:
    """(stage, op) → launches in one frame of `sessions` sessions on the engine path."""
    cfg, prof = VoiceChatConfig.named(config), Profile.named(profile)
    model = VoiceChat(cfg, prof, "meta")
    dtype_of = load_dtype(cfg, prof)
    model.load({n: torch.zeros(s, dtype=dtype_of(n), device="meta")
                for n, s in param_shapes(cfg).items()})
    counter = _Census()
    decode_ops.install(model, _StandIns(counter))

    def quietly(name, make):
        counter.launch(name)
        counter.quiet += 1
        try:
            return make()
        finally:
            counter.quiet -= 1

    def norm_stand_in(x, weight, eps):
        return quietly("triton rms_norm", lambda: torch.empty_like(x))

    def residual_stand_in(x, y, w_post, eps, w_next):
        return quietly("triton residual_rms_norm",
                       lambda: (torch.empty_like(x), None if w_next is None else torch.empty_like(x)))

    def mlp_stand_in(mlp, x):
        gu = torch.nn.functional.linear(x, decode_ops.fused_gate_up_weight(mlp))
        return mlp.down_proj(quietly("triton gelu_mul", lambda: gu[..., :gu.shape[-1] // 2].clone()))

    for module in model.modules():                          # what install() fused
        if isinstance(module, talker_text.GatedMLP) and module.fused is not None:
            module.fused = mlp_stand_in
        elif getattr(module, "fused", None) is not None:    # the RMSNorms
            module.fused = norm_stand_in
        if getattr(module, "fused_residual", None) is not None:
            module.fused_residual = residual_stand_in
    state = model.alloc_state(sessions, 1600, 8)
    slots = torch.arange(sessions, device="meta")
    fns, _ = stage_fns(model, state, slots, torch.zeros(sessions, 1280, device="meta"),
                       torch.zeros(sessions, dtype=torch.long, device="meta"))
    with torch.no_grad(), counter:
        for name, f in fns.items():
            counter.stage = name
            f()
    return counter.counts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--profile", default="reference")
    ap.add_argument("--config", default="full")
    ap.add_argument("--rows", type=int, default=8)
    args = ap.parse_args()
    counts = census(args.sessions, args.profile, args.config)
    stages = list(dict.fromkeys(stage for stage, _ in counts))
    beat = 0
    for stage in stages:
        rows = sorted(((op, n) for (s, op), n in counts.items() if s == stage), key=lambda r: -r[1])
        n = sum(c for _, c in rows)
        once = stage in PER_BEAT                  # run once a beat for both frames
        beat += n if once else 2 * n
        print(f"{stage:11} {n:5d} launches {'a beat ' if once else 'a frame'}: "
              + ", ".join(f"{op} {c}" for op, c in rows[:args.rows]))
    print(f"{'beat':11} {beat:5d} launches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
