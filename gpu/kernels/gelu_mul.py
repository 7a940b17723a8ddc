"""gelu_tanh(gate) · up in one launch, from the fused [gate | up] matmul output of a gated MLP.

The talker's gated MLPs (28 backbone layers, 3 MoG blocks × 5 passes, the char encoder: ~44 a
frame) take 5 launches each unfused: gate matmul, up matmul, GELU, multiply and down matmul. With
the gate and up weights as one matrix (decode_ops.fused_rows_weight) and this kernel they take 3.

Per element, fp32: gelu_tanh(g) = ½·g·(1 + tanh(t)), t = √(2/π)·(g + 0.044715·g³), computed as
g·σ(2t) = g / (1 + exp(−2t)), the same value: Triton has no portable tanh for the CPU
interpreter, and this form has no cancellation near t = 0 (1 − 2/(exp(2t) + 1) loses ~1e-7
absolute there) and saturates without NaN where exp overflows. Against torch's GELU: inside 1e-6
relative. Bytes: read 2·I, write I per row; bandwidth-bound, and at the talker's few hundred rows
latency-bound (one launch is the point).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpu.kernels._check import check

BLOCK = 1024
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@triton.jit
def _gelu_mul_kernel(GU, OUT, total, inner, stride_row, K0: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < total
    row, col = i // inner, i % inner
    g = tl.load(GU + row * stride_row + col, mask=m, other=0.0)
    u = tl.load(GU + row * stride_row + inner + col, mask=m, other=0.0)
    t = K0 * (g + 0.044715 * g * g * g)
    tl.store(OUT + i, g / (1.0 + tl.exp(-2.0 * t)) * u, mask=m)


def gelu_mul(gu):
    """gu [..., 2·I] fp32 = [gate | up] (unit stride in the last dim, leading dims collapsible to
    one row stride) → gelu_tanh(gate)·up [..., I], a new contiguous tensor."""
    check("gu", gu, (None,) * gu.dim(), (torch.float32,), contiguous=False, device=gu.device)
    assert gu.shape[-1] % 2 == 0, f"gu: last dim {gu.shape[-1]} is not [gate | up]"
    inner = gu.shape[-1] // 2
    assert gu.stride(-1) == 1, f"gu: last dim must have stride 1 (strides {gu.stride()})"
    rows2 = gu.view(-1, 2 * inner)
    out = torch.empty(*gu.shape[:-1], inner, device=gu.device, dtype=gu.dtype)
    total = rows2.shape[0] * inner
    if total:
        _gelu_mul_kernel[(triton.cdiv(total, BLOCK),)](rows2, out, total, inner, rows2.stride(0),
                                                      K0=SQRT_2_OVER_PI, BLOCK=BLOCK)
    return out


def gelu_mul_ref(gu):
    """PyTorch twin, the reference GatedMLP's op order."""
    gate, up = gu.chunk(2, dim=-1)
    return torch.nn.functional.gelu(gate, approximate="tanh") * up
