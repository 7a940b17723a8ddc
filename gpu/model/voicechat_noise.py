"""The talker's per-frame noise (docs/MODEL.md §2.5: 8×M uniforms and 8×D normals per session-frame)
as a pure function of (seed, session, frame): a counter-based hash, batched, device-agnostic.

Algorithm. key_b = H(H(H(seed) ^ session_b) ^ frame_b) with H the 32-bit `lowbias32` integer
hash (Wellons); element i of the frame's stream is v = H(H(key ^ H(i)) + key) (mod 2^32).
Uniforms are the top 24 bits of v as [0, 1) floats (exact in fp32, identical on every device);
normals are Box-Muller over two uniforms (u1 shifted half a step, so log never sees 0).
Everything is int64 tensor arithmetic with products kept below 2^63, so the same draws come out
on the CPU and on a GPU, inside or outside a CUDA graph, for any batch composition: a session's
noise never depends on which other sessions share the beat. The normals go through log, sqrt and
cos, whose last-ulp rounding may differ between devices; the uniforms are bit-exact.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

M32 = 0xFFFFFFFF
_MUL_A, _MUL_B = 0x7FEB352D, 0x846CA68B          # lowbias32 multipliers
_SEED_SALT = 0x9E3779B9


def _mul32(x: Tensor, c: int) -> Tensor:
    """x·c mod 2^32 for x in [0, 2^32) int64, split in 16-bit halves so nothing overflows."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & M32


def hash32(x: Tensor) -> Tensor:
    """lowbias32: a bijection of [0, 2^32) with good avalanche; int64 in, int64 out."""
    x = x & M32
    x = x ^ (x >> 16)
    x = _mul32(x, _MUL_A)
    x = x ^ (x >> 15)
    x = _mul32(x, _MUL_B)
    return x ^ (x >> 16)


def frame_keys(seed: int, session: Tensor, frame: Tensor) -> Tensor:
    """One 32-bit key per row: session [B] and frame [B] int64 → key [B] int64."""
    s = hash32(torch.full_like(session, (seed ^ _SEED_SALT) & M32))
    return hash32(hash32(s ^ (session & M32)) ^ (frame & M32))


def _stream(keys: Tensor, n: int) -> Tensor:
    """n hashed words per key: [B] → [B, n] int64 in [0, 2^32)."""
    idx = hash32(torch.arange(n, device=keys.device, dtype=torch.int64))
    k = keys[:, None]
    return hash32((hash32(k ^ idx) + k) & M32)


@dataclass
class FrameNoise:
    """The noise of one frame for B sessions: explicit step inputs, so every backend can feed the
    same draws."""
    uniforms: Tensor     # fp32 [B, n_steps, n_mixtures] in [0, 1): Gumbel draws of the mixture
    normals: Tensor      # fp32 [B, n_steps, latent]: ε of the sampled latent

    @classmethod
    def draw(cls, seed: int, session: Tensor, frame: Tensor, n_steps: int, n_mixtures: int,
             latent: int) -> "FrameNoise":
        """Deterministic in (seed, session[b], frame[b]) row by row."""
        keys = frame_keys(seed, session.long(), frame.long())
        b = keys.shape[0]
        n_u, n_n = n_steps * n_mixtures, n_steps * latent
        words = _stream(keys, n_u + 2 * n_n)
        unit = (words >> 8).to(torch.float32) * (1.0 / (1 << 24))        # [0, 1), exact
        uniforms = unit[:, :n_u].view(b, n_steps, n_mixtures)
        u1 = unit[:, n_u:n_u + n_n] + 0.5 / (1 << 24)                      # (0, 1)
        u2 = unit[:, n_u + n_n:]
        normals = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
        return cls(uniforms, normals.view(b, n_steps, latent))

    @classmethod
    def for_talker(cls, cfg, seed: int, session: Tensor, frame: Tensor) -> "FrameNoise":
        """`draw` with the sizes of a TalkerConfig."""
        return cls.draw(seed, session, frame, cfg.n_steps, cfg.n_mixtures, cfg.latent)
