"""Perception's configuration and its weights by their checkpoint names: the shapes a
checkpoint must hold (`param_shapes`) and random weights of those shapes (`init_random`, as
docs/MODEL.md §8 draws them), apart from the encoder that runs them (`perception.py`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

PREFIX = "stt_model.perception."
NORMS = ("norm_feed_forward1", "norm_self_att", "norm_conv", "norm_feed_forward2", "norm_out")
RESIDUAL_OUT = ("linear2.weight", "linear_out.weight", "pointwise_conv2.weight")


@dataclass(frozen=True)
class PerceptionConfig:
    n_layers: int = 24
    d_model: int = 1024
    n_heads: int = 8
    ff_expansion: int = 4
    conv_kernel: int = 9
    left_context: int = 70        # att_context_size [70, 0]
    sub_channels: int = 256       # subsampling_conv_channels (inferred)
    mel_bins: int = 128
    out_dim: int = 4480           # proj output = thinker hidden
    use_bias: bool = False        # encoder linears/convs; norms, subsampling and proj have biases
    eps: float = 1e-5
    history_cols: int = 9         # pre_encode_cache_size
    new_cols: int = 8             # mel columns per frame
    drop_frames: int = 2          # drop_extra_pre_encoded
    chunk_frames: int = 2         # the most frames one streaming step takes per session

    def __post_init__(self):
        assert self.d_model % self.n_heads == 0
        assert subsampled_len(self.window_cols) - self.drop_frames == 1, "one encoder frame per step"

    @classmethod
    def full(cls) -> "PerceptionConfig":
        return cls()

    @classmethod
    def tiny(cls) -> "PerceptionConfig":
        # left_context 5 so a 12-frame test evicts cache rows; out_dim = ThinkerConfig.tiny().hidden
        return cls(n_layers=2, d_model=32, n_heads=2, left_context=5, sub_channels=4, mel_bins=32, out_dim=64)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ff_dim(self) -> int:
        return self.d_model * self.ff_expansion

    @property
    def ring_rows(self) -> int:
        return self.left_context + self.chunk_frames

    @property
    def time_cache(self) -> int:
        return self.conv_kernel - 1

    @property
    def sub_freq(self) -> int:
        return subsampled_len(self.mel_bins)        # 128 → 17

    @property
    def window_cols(self) -> int:
        return self.history_cols + self.new_cols    # 17


def subsampled_len(n: int) -> int:
    """Length after the three causal stride-2 convs: each gives ⌊n/2⌋ + 1."""
    for _ in range(3):
        n = n // 2 + 1
    return n


def param_shapes(cfg: PerceptionConfig) -> dict[str, tuple]:
    D, C, H = cfg.d_model, cfg.sub_channels, cfg.n_heads
    s: dict[str, tuple] = {}
    pre = PREFIX + "encoder.pre_encode."
    for i, shape in ((0, (C, 1, 3, 3)), (2, (C, 1, 3, 3)), (3, (C, C, 1, 1)), (5, (C, 1, 3, 3)), (6, (C, C, 1, 1))):
        s[f"{pre}conv.{i}.weight"], s[f"{pre}conv.{i}.bias"] = shape, (C,)
    s[pre + "out.weight"], s[pre + "out.bias"] = (D, C * cfg.sub_freq), (D,)
    for i in range(cfg.n_layers):
        L = f"{PREFIX}encoder.layers.{i}."
        for n in NORMS + ("conv.batch_norm",):
            s[L + n + ".weight"], s[L + n + ".bias"] = (D,), (D,)
        lin = {"feed_forward1.linear1": (cfg.ff_dim, D), "feed_forward1.linear2": (D, cfg.ff_dim),
               "feed_forward2.linear1": (cfg.ff_dim, D), "feed_forward2.linear2": (D, cfg.ff_dim),
               "self_attn.linear_q": (D, D), "self_attn.linear_k": (D, D), "self_attn.linear_v": (D, D),
               "self_attn.linear_out": (D, D), "conv.pointwise_conv1": (2 * D, D, 1),
               "conv.depthwise_conv": (D, 1, cfg.conv_kernel), "conv.pointwise_conv2": (D, D, 1)}
        for n, shape in lin.items():
            s[L + n + ".weight"] = shape
            if cfg.use_bias:
                s[L + n + ".bias"] = (shape[0],)
        s[L + "self_attn.linear_pos.weight"] = (D, D)      # never has a bias in NeMo
        s[L + "self_attn.pos_bias_u"] = s[L + "self_attn.pos_bias_v"] = (H, cfg.head_dim)
    s[PREFIX + "proj.weight"], s[PREFIX + "proj.bias"] = (cfg.out_dim, D), (cfg.out_dim,)
    return s


def init_random(cfg: PerceptionConfig, generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """docs/MODEL.md §8: weights N(0, 1/fan_in) (residual outputs ×1/√(2·layers)), biases 0, norms 1/0."""
    out = {}
    for name, shape in param_shapes(cfg).items():
        is_norm = any(f".{n}." in name for n in NORMS + ("batch_norm",))
        if is_norm and name.endswith(".weight"):
            out[name] = torch.ones(shape)
        elif name.endswith("bias") or "pos_bias" in name:         # incl. norm biases, pos_bias_u/v
            out[name] = torch.zeros(shape)
        else:
            fan_in = math.prod(shape[1:])
            std = 1.0 / math.sqrt(fan_in)
            if name.endswith(RESIDUAL_OUT):
                std /= math.sqrt(2 * cfg.n_layers)
            out[name] = torch.randn(shape, generator=generator) * std
    return out
