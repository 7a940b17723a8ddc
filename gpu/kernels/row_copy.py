"""Rows of one layered state tensor into rows of another, by device index: a prompt snapshot's
thinker state copied into the slots that start from it, in one launch per tensor.

A state tensor is [L, S, ...]: per layer, a slot's row is contiguous. Copy i moves row
src_rows[i] of every layer of `src` into row dst_rows[i] of `dst`, or, with `counts`, only its
first counts[i]·per_count elements (the KV rows of a prompt's positions). The rows come from the
device, so the launch is the same for any slots and entries: a CUDA graph captures it once and
replays it for each beat's copies (one replay, where plain slicing took ~5 launches a copy and a
host dispatch for each; calls coming and going start one or two a beat, and the host's dispatch,
not the device's bytes, was what a lone start cost).

Rows repeated in one launch (a padded count: the last copy again) write the same values twice,
which leaves what one write leaves. Bytes: each copied element is read once and written once.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu.kernels._check import INDEX, check

BLOCK = 2048


@triton.jit
def _row_copy_kernel(DST, SRC, dst_rows, src_rows, counts, per_count, width,
                     dst_layer, dst_row, src_layer, src_row,
                     HAS_COUNTS: tl.constexpr, BLOCK: tl.constexpr):
    b, layer, i = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    d = tl.load(dst_rows + i).to(tl.int64)
    s = tl.load(src_rows + i).to(tl.int64)
    n = width
    if HAS_COUNTS:
        n = tl.minimum(tl.load(counts + i).to(tl.int64) * per_count, width)
    offs = b.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(SRC + layer * src_layer + s * src_row + offs, mask=m)
    tl.store(DST + layer * dst_layer + d * dst_row + offs, x, mask=m)


def _layered(name: str, t: torch.Tensor) -> None:
    check(name, t, (None,) * t.dim(), (t.dtype,), contiguous=False, device=t.device)
    assert t.dim() >= 3, f"{name}: expected [layers, rows, ...], got {tuple(t.shape)}"
    inner = t[0, 0]
    assert inner.is_contiguous(), f"{name}: a row must be contiguous (strides {t.stride()})"


def copy_rows(dst: torch.Tensor, dst_rows: torch.Tensor, src: torch.Tensor,
              src_rows: torch.Tensor, counts: torch.Tensor | None = None) -> None:
    """dst [L, S, ...] ← src [L, E, ...] row by row: dst[:, dst_rows[i]] = src[:, src_rows[i]],
    or with counts only its first counts[i] entries of dim 2 (src's dim 2 may be shorter than
    dst's: a snapshot holds a prompt's positions, the slot a whole context). Same dtype; rows
    contiguous from dim 2 on; the index tensors on the same device, int32 or int64."""
    _layered("dst", dst)
    _layered("src", src)
    assert dst.dtype == src.dtype, f"dtypes differ: dst {dst.dtype}, src {src.dtype}"
    assert dst.shape[0] == src.shape[0] and dst.shape[3:] == src.shape[3:], \
        f"shapes differ past the row: dst {tuple(dst.shape)}, src {tuple(src.shape)}"
    n = dst_rows.shape[0]
    for name, t in (("dst_rows", dst_rows), ("src_rows", src_rows)) + \
            ((("counts", counts),) if counts is not None else ()):
        check(name, t, (n,), INDEX, device=dst.device)
    if counts is None:
        assert dst.shape[2:] == src.shape[2:], \
            f"whole rows need equal rows: dst {tuple(dst.shape)}, src {tuple(src.shape)}"
    else:
        assert src.shape[2] <= dst.shape[2], \
            f"src rows ({src.shape[2]}) longer than dst rows ({dst.shape[2]})"
    width = src[0, 0].numel()
    per_count = src[0, 0, 0].numel() if counts is not None else 0
    if not (n and width and dst.shape[0]):
        return
    grid = (triton.cdiv(width, BLOCK), dst.shape[0], n)
    _row_copy_kernel[grid](dst, src, dst_rows, src_rows,
                           counts if counts is not None else dst_rows, per_count, width,
                           dst.stride(0), dst.stride(1), src.stride(0), src.stride(1),
                           HAS_COUNTS=counts is not None, BLOCK=BLOCK)


def copy_rows_ref(dst: torch.Tensor, dst_rows: torch.Tensor, src: torch.Tensor,
                  src_rows: torch.Tensor, counts: torch.Tensor | None = None) -> None:
    """PyTorch twin: one slice assignment a copy."""
    for i, (d, s) in enumerate(zip(dst_rows.tolist(), src_rows.tolist())):
        if counts is None:
            dst[:, d] = src[:, s]
        else:
            p = min(int(counts[i]), src.shape[2])
            dst[:, d, :p] = src[:, s, :p]
