"""fp8 e4m3 (the `float8_e4m3fn` format: 1 sign, 4 exponent, 3 mantissa bits, bias 7, no
infinities, largest 448) kept as its bit pattern in uint8, for KV caches: the kernels decode the
bits themselves (`gpu/kernels/e4m3.py`; Triton's interpreter has no fp8 type), and these are
the PyTorch twins. Values are divided by a per-head scale before encoding and multiplied by it
after decoding; encoding saturates at ±448 (torch's plain cast would give NaN past it)."""
from __future__ import annotations

import torch

E4M3_MAX = 448.0


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """fp32 values (already divided by their scale) → e4m3 bits as uint8, to nearest, ties to
    even, saturating."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def from_e4m3(bits: torch.Tensor) -> torch.Tensor:
    """e4m3 bits (uint8) → fp32 values (still to be multiplied by their scale)."""
    return bits.view(torch.float8_e4m3fn).float()
