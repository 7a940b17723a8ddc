"""Number formats the state is stored in, as PyTorch twins of what the kernels do in bits.

fp8 e4m3 (the `float8_e4m3fn` format: 1 sign, 4 exponent, 3 mantissa bits, bias 7, no
infinities, largest 448) kept as its bit pattern in uint8, for KV caches: the kernels decode the
bits themselves (`gpu/kernels/e4m3.py`; Triton's interpreter has no fp8 type). Values are
divided by a per-head scale before encoding and multiplied by it after decoding; encoding
saturates at ±448 (torch's plain cast would give NaN past it).

Stochastic rounding of a bf16 SSM state (the `dense-ssm16-sr` profile). A state kept in bf16 is
rounded after every frame. Rounded to nearest, each step's error is up to half a bf16 ulp and,
for a state that changes slowly, of the same sign step after step: over thousands of frames the
errors add up instead of averaging out. Rounded stochastically, a value goes up with the
probability of its distance to the lower bf16 neighbour, so its expected value is the fp32 one.
The random bits are a hash, not a generator: of the element's index in the slot's state
([heads, head_dim, d_state] flattened), the session's position (the thinker's `length` before
the step) and the layer. So a step's rounding depends only on the session's own history (not
on its slot or its neighbours), the same state rounds the same way on every run, and the
Triton kernel (`gpu/kernels/mamba_step.py`) draws the same bits. After a roll a position's
bits come back, hundreds of frames apart, on a state that has moved on since. The hash is
32-bit integer arithmetic modulo 2**32, written here in int64 with masks.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

E4M3_MAX = 448.0


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """fp32 values (already divided by their scale) → e4m3 bits as uint8, to nearest, ties to
    even, saturating."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def from_e4m3(bits: torch.Tensor) -> torch.Tensor:
    """e4m3 bits (uint8) → fp32 values (still to be multiplied by their scale)."""
    return bits.view(torch.float8_e4m3fn).float()


MASK = 0xFFFFFFFF
GOLDEN = 0x9E3779B1          # spreads consecutive positions over the 32-bit range
MUL1, MUL2 = 0x7FEB352D, 0x846CA68B


def mix32(x: Tensor) -> Tensor:
    """A 32-bit integer hash (xor-shift-multiply), on int64 values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * MUL1) & MASK
    x = x ^ (x >> 15)
    x = (x * MUL2) & MASK
    return x ^ (x >> 16)


def dither(length: Tensor, layer: int, shape: tuple[int, ...]) -> Tensor:
    """The 16 random bits each element adds before truncation: int64 [B, *shape] for the rows'
    positions `length` [B] in this layer."""
    key = mix32(((length.to(torch.int64) & MASK) * GOLDEN + layer) & MASK)        # [B]
    elem = torch.arange(math.prod(shape), device=length.device, dtype=torch.int64).reshape(shape)
    view = (-1,) + (1,) * len(shape)
    return mix32((elem + key.reshape(view)) & MASK) & 0xFFFF


def round_bf16_stochastic(x: Tensor, length: Tensor, layer: int) -> Tensor:
    """x [B, ...] fp32 → bf16, each element rounded up with the probability of its distance to
    the bf16 value below it (in magnitude), by `dither`'s bits; NaN stays NaN."""
    bits = x.float().contiguous().view(torch.int32).to(torch.int64) & MASK
    kept = (bits + dither(length, layer, tuple(x.shape[1:]))) & 0xFFFF0000
    kept = kept - ((kept >> 31) << 32)                     # back into int32's range
    out = kept.to(torch.int32).view(torch.float32)
    return torch.where(torch.isnan(x), x.float(), out).to(torch.bfloat16)


def store_ssm(new: Tensor, dtype: torch.dtype, rounding: str, length: Tensor,
              layer: int) -> Tensor:
    """A step's new SSM state [B, h, p, n] (fp32) as the state keeps it: `dtype`, rounded to
    nearest or (`rounding` "stochastic", a bf16 state only, as the kernel) stochastically."""
    if rounding != "stochastic":
        return new.to(dtype)
    if dtype != torch.bfloat16:
        raise ValueError("mamba_step: stochastic rounding is for a bf16 ssm_state")
    return round_bf16_stochastic(new, length, layer)
