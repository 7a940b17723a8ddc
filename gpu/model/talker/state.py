"""The talker's per-slot state (KV caches, positions, the codes fed back) and what a frame
takes and gives (`TalkerInputs`, `TalkerOutput`): slot resets, context rolls, the CFG rows and
KV dtype of each precision profile. The model itself is `talker/talker.py`."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from gpu.model.formats import from_e4m3, to_e4m3
from gpu.model.slots import fill_slots, roll_blocks
from gpu.model.talker.text import rope_cos_sin

if TYPE_CHECKING:
    from gpu.model.talker.config import TalkerConfig

Profile = Literal["reference", "dense"]
PROFILES: dict[str, tuple[int, torch.dtype]] = {      # CFG rows, KV dtype (docs/MODEL.md §4)
    "reference": (2, torch.float32),
    "dense": (1, torch.bfloat16),
}


def aligned_positions(positions: int, head_dim: int) -> int:
    """`positions` rounded up so that one head's span, positions·head_dim elements, is a multiple
    of 16. Triton specialises an integer argument on divisibility by 16, and only then can it
    prove each K/V row 16-byte aligned and load it as vectors: with an odd P (head_dim 72) the
    talker's decode attention streams well below the byte floor (bench/results/attn-layout-h200.json)."""
    step = 16 // math.gcd(16, head_dim)
    return -(-positions // step) * step


@dataclass
class TalkerState:
    """Per-slot talker state; every tensor's leading dim is max_slots."""
    # Head-major: each (slot, layer, row, head) keeps its positions contiguous, so the decode
    # kernel streams whole cache lines (a position-major layout does not, and runs well below the
    # byte floor).
    k: Tensor           # [S, L, R, kv_heads, P, head_dim] rotated keys, R = CFG rows
    v: Tensor           # [S, L, R, kv_heads, P, head_dim]
    position: Tensor    # int64 [S]: next position to write (0 at reset, n_warmup when live);
                        # the caller ends a session before it reaches P (a check would sync)
    prev_codes: Tensor  # int64 [S, Q]: codes fed back at the next frame (PAD at reset)
    pad_code: int
    # fp8 caches (k, v uint8: e4m3 bits): the scale of each layer's keys and values per kv
    # head, [L, 2, kv_heads] fp32, set from the weights at load; None for fp32 / bf16 caches
    kv_scale: Tensor | None = None

    @property
    def kv8(self) -> bool:
        return self.k.dtype == torch.uint8

    def stored(self, x: Tensor, layer: int, which: int) -> Tensor:
        """Keys (which 0) or values (1) [..., kv_heads, D] of `layer` as the cache holds them."""
        if not self.kv8:
            return x.to(self.k.dtype)
        return to_e4m3(x / self.kv_scale[layer, which, :, None])

    def loaded(self, x: Tensor, layer: int, which: int, heads: int = -2) -> Tensor:
        """Cache rows of `layer` back to fp32; `heads` is the dim of x that is the kv head."""
        if not self.kv8:
            return x.float()
        shape = [1] * x.dim()
        shape[heads] = -1
        return from_e4m3(x) * self.kv_scale[layer, which].view(shape)

    @property
    def rows(self) -> int:
        return self.k.shape[2]

    @property
    def max_positions(self) -> int:
        return self.k.shape[4]

    @classmethod
    def alloc(cls, cfg: TalkerConfig, max_slots: int, max_positions: int,
              device: torch.device | str = "cpu", profile: Profile = "reference",
              kv_dtype: torch.dtype | None = None,
              kv_scale: Tensor | None = None) -> "TalkerState":
        if max_positions > cfg.max_positions:
            raise ValueError(f"max_positions {max_positions} > cap {cfg.max_positions}")
        rows, default_dtype = PROFILES[profile]
        shape = (max_slots, cfg.n_layers, rows, cfg.n_kv_heads,
                 aligned_positions(max_positions, cfg.head_dim), cfg.head_dim)
        dtype = kv_dtype or default_dtype
        scale = None
        if dtype == torch.float8_e4m3fn:
            dtype = torch.uint8                         # the bits: kernels decode them
            scale = (torch.ones(cfg.n_layers, 2, cfg.n_kv_heads, device=device)
                     if kv_scale is None else kv_scale.to(device=device, dtype=torch.float32))
        return cls(torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(max_slots, dtype=torch.long, device=device),
                   torch.full((max_slots, cfg.n_codebooks), cfg.pad_code, dtype=torch.long,
                              device=device),
                   cfg.pad_code, scale)

    def reset(self, slots: Tensor) -> None:
        """Re-initialise only these slots: position 0 and the pad codes. The KV rows are left
        as the last session wrote them (zeroing them would write ~200 MB a dense slot and
        ~800 MB a reference slot inside the beat a call starts in): no reader looks at a row at
        or past a slot's position. The decode kernel's loads stop there, and `attend` zeroes
        the values no query sees, so a stale row, NaN included, reaches no output."""
        fill_slots(self.position, slots, 0)
        fill_slots(self.prev_codes, slots, self.pad_code)

    def roll(self, slot: int, sink: int, drop: int, turn: tuple[Tensor, Tensor]) -> None:
        """Slot `slot`'s `drop` oldest positions after its first `sink` (the warm-up) leave the
        KV cache: the later rows move down, their keys rotated back by `drop` positions, and its
        position shrinks by `drop`. `turn` = `roll_turn(cfg, drop)`: each layer's rotation by
        −drop at its RoPE θ. Keys then sit where they would had the dropped positions never
        run: every distance between the window's queries and keys is kept, the sinks come
        closer (StreamingLLM). Every row up to the cache's size moves (the caller rolls a
        session near its end), so nothing is read back to the host; a few launches a block
        (`roll_blocks`), whatever the layers."""
        cap = self.max_positions
        if sink + drop > cap:
            raise ValueError(f"cannot drop {drop} positions after {sink} sinks of {cap}")
        cos_full, sin_signed = turn                                       # [L, 1, 1, 1, D]
        half = self.k.shape[-1] // 2
        # an fp8 cache's keys are decoded, turned and encoded again with their head's scale
        per_head = self.kv_scale[:, 0, None, :, None, None] if self.kv8 else None
        for a, b in roll_blocks(sink, cap - drop, self.k[slot, ..., 0, :].numel() * 4, drop):
            self.v[slot, ..., a:b, :] = self.v[slot, ..., a + drop:b + drop, :]
            keys = self.k[slot, ..., a + drop:b + drop, :]                # [L, R, kv, n, D]
            keys = from_e4m3(keys) * per_head if self.kv8 else keys.float()
            turned = keys * cos_full + keys.roll(half, dims=-1) * sin_signed
            self.k[slot, ..., a:b, :] = (to_e4m3(turned / per_head) if self.kv8
                                         else turned.to(self.k.dtype))
        self.position[slot] -= drop


@dataclass
class TalkerInputs:
    y: Tensor           # int64 [B]: thinker text token y_t
    uniforms: Tensor    # fp32 [B, n_steps, n_mixtures]
    normals: Tensor     # fp32 [B, n_steps, latent]
    idle: Tensor        # bool [B]: the assistant is idle (PAD then means silence)


@dataclass
class TalkerOutput:
    codes: Tensor        # int64 [B, Q]: the generated codes
    codec_codes: Tensor  # int64 [B, Q]: what the codec decodes (silence-substituted)
    hidden: Tensor       # [B, R, H]: backbone output per CFG row (checks and debugging)


def roll_turn(cfg: TalkerConfig, drop: int, device) -> tuple[Tensor, Tensor]:
    """Per layer, the RoPE tables ([cos | cos], [−sin | sin]) [L, 1, 1, 1, D] that turn a stored
    key back by `drop` positions at that layer's θ (`TalkerState.roll`)."""
    back = torch.tensor(-float(drop), device=device)
    per_theta = {}
    for theta in (cfg.rope_theta_full, cfg.rope_theta_local):
        cos, sin = rope_cos_sin(back, cfg.head_dim, theta)                # [D/2] each
        per_theta[theta] = torch.cat([cos, cos]), torch.cat([-sin, sin])
    thetas = [cfg.rope_theta_full if full else cfg.rope_theta_local for full in cfg.full_layers]
    cos_full = torch.stack([per_theta[t][0] for t in thetas])[:, None, None, None]
    sin_signed = torch.stack([per_theta[t][1] for t in thetas])[:, None, None, None]
    return cos_full, sin_signed
