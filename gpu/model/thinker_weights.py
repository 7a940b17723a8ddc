"""The thinker's configuration (its layer pattern and sizes) and its weights by their
checkpoint names: the shapes a checkpoint must hold (`param_shapes`) and random weights of those
shapes (`init_random`, as docs/MODEL.md §8 draws them), apart from the model (`thinker.py`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

PREFIX = "stt_model."
PATTERN = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"


@dataclass(frozen=True)
class ThinkerConfig:
    pattern: str = PATTERN
    hidden: int = 4480
    vocab: int = 131_072
    eps: float = 1e-5
    mamba_heads: int = 128
    mamba_head_dim: int = 80
    n_groups: int = 8
    d_state: int = 128
    conv_kernel: int = 4
    mlp_dim: int = 15_680
    attn_heads: int = 40
    kv_heads: int = 8
    head_dim: int = 128
    text_weight: float = 1.0       # duplex_text_channel_weight
    user_weight: float = 1.0       # duplex_user_channel_weight (audio a_t, prompt tokens in prefill)
    func_weight: float = 2.0       # duplex_function_channel_weight: load-bearing

    def __post_init__(self):
        assert set(self.pattern) <= set("M-*") and self.mamba_heads % self.n_groups == 0
        assert self.attn_heads % self.kv_heads == 0

    @classmethod
    def full(cls) -> "ThinkerConfig":
        return cls()

    @classmethod
    def tiny(cls) -> "ThinkerConfig":
        # hidden = PerceptionConfig.tiny().out_dim; vocab keeps ids 1, 2, 11, 12, 20-22, 1000+255
        return cls(pattern="M-*M-*", hidden=64, vocab=2048, mamba_heads=8, mamba_head_dim=8, n_groups=2,
                   d_state=16, mlp_dim=128, attn_heads=4, kv_heads=2, head_dim=16)

    @property
    def n_layers(self) -> int:
        return len(self.pattern)

    @property
    def d_inner(self) -> int:
        return self.mamba_heads * self.mamba_head_dim                 # 10240

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.n_groups * self.d_state        # 12288

    @property
    def in_proj_dim(self) -> int:
        return self.d_inner + self.conv_dim + self.mamba_heads        # 22656 = [z | xBC | dt]

    @property
    def group_size(self) -> int:
        return self.d_inner // self.n_groups                          # 1280

    @property
    def layer_slot(self) -> tuple[int, ...]:
        """Index of each layer among the layers of its kind (its row in the state tensors)."""
        return tuple(self.pattern[:i].count(k) for i, k in enumerate(self.pattern))


def param_shapes(cfg: ThinkerConfig) -> dict[str, tuple]:
    H, V = cfg.hidden, cfg.vocab
    s = {PREFIX + "embed_tokens.weight": (V, H)}
    for i, kind in enumerate(cfg.pattern):
        L = f"{PREFIX}llm.layers.{i}."
        s[L + "norm.weight"] = (H,)
        m = L + "mixer."
        if kind == "M":
            s.update({m + "in_proj.weight": (cfg.in_proj_dim, H), m + "conv1d.weight": (cfg.conv_dim, 1, cfg.conv_kernel),
                      m + "conv1d.bias": (cfg.conv_dim,), m + "dt_bias": (cfg.mamba_heads,), m + "A_log": (cfg.mamba_heads,),
                      m + "D": (cfg.mamba_heads,), m + "norm.weight": (cfg.d_inner,), m + "out_proj.weight": (H, cfg.d_inner)})
        elif kind == "-":
            s.update({m + "up_proj.weight": (cfg.mlp_dim, H), m + "down_proj.weight": (H, cfg.mlp_dim)})
        else:
            q, kv = cfg.attn_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
            s.update({m + "q_proj.weight": (q, H), m + "k_proj.weight": (kv, H), m + "v_proj.weight": (kv, H),
                      m + "o_proj.weight": (H, q)})
    s[PREFIX + "llm.norm_f.weight"] = (H,)
    s[PREFIX + "lm_head.weight"] = s[PREFIX + "function_head.weight"] = (V, H)
    return s


def init_random(cfg: ThinkerConfig, generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """docs/MODEL.md §8. dt_bias = softplus⁻¹(log-uniform [1e-3, 1e-1]) with every 32nd head at 33.5."""
    out, g = {}, generator
    for name, shape in param_shapes(cfg).items():
        if name.endswith(("norm.weight", "norm_f.weight", ".D")):
            out[name] = torch.ones(shape)
        elif name.endswith(".conv1d.bias"):
            out[name] = torch.zeros(shape)
        elif name.endswith(".A_log"):
            out[name] = torch.log(torch.empty(shape).uniform_(1.0, 16.0, generator=g))
        elif name.endswith(".dt_bias"):
            dt = torch.exp(torch.empty(shape).uniform_(math.log(1e-3), math.log(1e-1), generator=g))
            dt[31::32] = 33.5
            dt[-1] = 33.5                                          # at least one huge-Δ head
            out[name] = dt + torch.log(-torch.expm1(-dt))          # softplus⁻¹
        elif name.endswith("embed_tokens.weight"):
            out[name] = torch.randn(shape, generator=g)
        else:                                                      # linear and conv weights
            std = 1.0 / math.sqrt(math.prod(shape[1:]))
            if name.endswith(("out_proj.weight", "down_proj.weight", "o_proj.weight")):
                std /= math.sqrt(2 * cfg.n_layers)
            out[name] = torch.randn(shape, generator=g) * std
    return out
