"""The talker's shape and sampling settings (`TalkerConfig`: the full model's and a tiny one of
the same structure) and the unmasking schedule its MoG head follows."""
from __future__ import annotations

import math
from dataclasses import dataclass

from wave_actors.core.sched.start_shape import TALKER_WARMUP
from wave_actors.core.text import VOCAB


def unmasking_schedule(n_codebooks: int, n_steps: int, exponent: float) -> tuple[int, ...]:
    """Codebooks emitted per step: w_s = n_s − n_{s+1}, n_s = ⌈Q·(1 − (s/S)^e)^{1/e}⌉, n_S = 0."""
    n = [math.ceil(n_codebooks * (1.0 - (s / n_steps) ** exponent) ** (1.0 / exponent))
         for s in range(n_steps)] + [0]
    return tuple(n[s] - n[s + 1] for s in range(n_steps))


@dataclass(frozen=True)
class TalkerConfig:
    text_vocab: int = VOCAB             # the thinker's vocabulary: rows of the char/flag tables
    n_chars: int = 256                  # single-character tokens; char pad id = n_chars
    max_chars: int = 16                 # M_c
    hidden: int = 1152
    n_layers: int = 28
    n_heads: int = 16
    n_kv_heads: int = 16
    head_dim: int = 72
    mlp: int = 4608
    rms_eps: float = 1e-6
    query_pre_attn_scalar: float = 256.0
    sliding_pattern: int = 6            # layer i is full attention iff (i + 1) % 6 == 0
    sliding_window: int = 7500
    rope_theta_full: float = 1e6
    rope_theta_local: float = 1e4
    char_rope_theta: float = 1e4
    char_softcap: float = 50.0
    max_positions: int = 7500           # KV cap per session, warm-up included (TM: ≤ 7500)
    n_codebooks: int = 31
    codebook_size: int = 1024
    latent: int = 512
    n_mixtures: int = 1024
    low_rank: int = 64
    mog_layers: int = 3
    n_steps: int = 8
    mask_exponent: float = 3.0
    cfg_scale: float = 0.2
    top_p: float = 0.95
    noise_scale: float = 1e-3
    min_log_std: float = -4.0
    n_warmup: int = TALKER_WARMUP       # Aria prompt rows 0..n-2, silence + BOS row n-1

    @classmethod
    def full(cls) -> "TalkerConfig":
        return cls()

    @classmethod
    def tiny(cls, text_vocab: int = 2048) -> "TalkerConfig":
        # Same structure: sliding and full layers (window 4 so it bites), 3-block MoG stack,
        # zero-width and multi-codebook unmasking steps (8 codebooks → [0,0,0,0,0,1,1,6]).
        return cls(text_vocab=text_vocab, max_chars=8, hidden=64, n_layers=4, n_heads=4,
                   n_kv_heads=4, head_dim=16, mlp=128, query_pre_attn_scalar=16.0,
                   sliding_pattern=2, sliding_window=4, max_positions=64, n_codebooks=8,
                   codebook_size=64, latent=32, n_mixtures=32, low_rank=4, n_warmup=8)

    def __post_init__(self):
        if self.n_heads * self.head_dim != self.hidden or self.n_heads % self.n_kv_heads:
            raise ValueError("need n_heads·head_dim == hidden and n_kv_heads | n_heads")
        if sum(self.schedule) != self.n_codebooks:
            raise ValueError(f"schedule {self.schedule} does not emit {self.n_codebooks} codebooks")

    @property
    def attn_scale(self) -> float:
        return self.query_pre_attn_scalar ** -0.5

    @property
    def full_layers(self) -> tuple[bool, ...]:
        return tuple((i + 1) % self.sliding_pattern == 0 for i in range(self.n_layers))

    @property
    def schedule(self) -> tuple[int, ...]:
        return unmasking_schedule(self.n_codebooks, self.n_steps, self.mask_exponent)

    @property
    def pad_code(self) -> int:
        return self.codebook_size

    @property
    def control_codes(self) -> tuple[int, int, int]:
        """(BOS, EOS, PAD) = 1026, 1025, 1024 for the full codebook."""
        return self.codebook_size + 2, self.codebook_size + 1, self.codebook_size
