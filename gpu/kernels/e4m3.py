"""fp8 e4m3 bits (uint8) encoded and decoded inside kernels (`gpu/model/formats.py` says the format
and holds the PyTorch twins): Triton's interpreter has no fp8 type, so the bits are made in
integer arithmetic, which gives the same bits as torch's own conversion (round to nearest, ties
to even) on every backend."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def e4m3_encode(x):
    """fp32 → e4m3 bits (uint8), saturating at ±448."""
    a = tl.minimum(tl.abs(x), 448.0)
    b = a.to(tl.uint32, bitcast=True)
    r = b + 0x7FFFF + ((b >> 20) & 1)                  # to 3 mantissa bits, ties to even
    normal = ((r >> 23).to(tl.int32) - 120) * 8 + ((r >> 20) & 7).to(tl.int32)
    y = a * 512.0                                       # subnormals: steps of 2^-9
    f = tl.floor(y)
    rest = y - f
    fi = f.to(tl.int32)
    sub = fi + ((rest > 0.5) | ((rest == 0.5) & ((fi & 1) == 1))).to(tl.int32)
    bits = tl.where(a < 0.015625, sub, normal)
    sign = (x.to(tl.uint32, bitcast=True) >> 31).to(tl.int32) * 128     # -0.0 included
    return (bits + sign).to(tl.uint8)


@triton.jit
def e4m3_decode(raw):
    """e4m3 bits (uint8) → fp32, exactly."""
    b = raw.to(tl.uint32)
    e = (b >> 3) & 15
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    v = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
    return tl.where((b & 128) != 0, -v, v)


def kv_scales(kv_scale, cache: torch.Tensor, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and value scales [kv_heads] a kernel reads for a uint8 (fp8) cache, checked; for
    other caches the cache itself, as a pointer the kernel never reads (no tensor made: on the
    talker's launch-bound path a fill kernel a call would cost two launches a layer)."""
    if cache.dtype != torch.uint8:
        return cache, cache
    assert kv_scale is not None, "a uint8 (fp8) cache needs kv_scale [2, kv_heads]"
    assert tuple(kv_scale.shape) == (2, kv_heads) and kv_scale.dtype == torch.float32, \
        f"kv_scale: expected fp32 [2, {kv_heads}], got {kv_scale.dtype} {tuple(kv_scale.shape)}"
    assert kv_scale.device == cache.device, f"kv_scale on {kv_scale.device}, cache on {cache.device}"
    return kv_scale[0].contiguous(), kv_scale[1].contiguous()
