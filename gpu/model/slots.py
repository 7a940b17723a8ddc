"""Writing a constant into some sessions' rows of a state tensor.

`t[index] = 0` with a device index tensor wraps the 0 as a host tensor and copies it over, which
a CUDA graph capture refuses (the captured slot resets run these writes). `index_fill_` takes the
constant as a kernel argument instead, so the same write runs eagerly and under capture.
"""
from __future__ import annotations

from torch import Tensor


def fill_slots(t: Tensor, slots: Tensor | slice, value, dim: int = 0) -> None:
    """Rows `slots` of `t` along `dim` set to the constant `value`: an index tensor (index_fill_)
    or a slice of consecutive slots (a fill of a view)."""
    if isinstance(slots, slice):
        t[(slice(None),) * dim + (slots,)] = value
    else:
        t.index_fill_(dim, slots, value)
