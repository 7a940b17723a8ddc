"""Writes into some sessions' rows of a state tensor: a constant (a reset) or a roll.

A constant: `t[index] = 0` with a device index tensor wraps the 0 as a host tensor and copies it over, which
a CUDA graph capture refuses (the captured slot resets run these writes). `index_fill_` takes the
constant as a kernel argument instead, so the same write runs eagerly and under capture.

A roll, at the end of a session's context: the rows of its attention caches after its sinks move
down by the frames dropped (ThinkerState.roll, TalkerState.roll). Moved in blocks of positions,
lowest first, each no longer than the drop: a block's source rows lie wholly above the rows it
writes, so it copies without a temporary; the block before it has read the rows it overwrites
(the copies are ordered on one stream); temporaries (the talker's rotated keys) stay a block's
size instead of a whole cache's.
"""
from __future__ import annotations

from torch import Tensor

ROLL_BLOCK_BYTES = 64 << 20     # the most temporary memory one block of a roll takes


def fill_slots(t: Tensor, slots: Tensor | slice, value, dim: int = 0) -> None:
    """Rows `slots` of `t` along `dim` set to the constant `value`: an index tensor (index_fill_)
    or a slice of consecutive slots (a fill of a view)."""
    if isinstance(slots, slice):
        t[(slice(None),) * dim + (slots,)] = value
    else:
        t.index_fill_(dim, slots, value)


def roll_blocks(first: int, stop: int, bytes_per_position: int, drop: int) -> list[tuple[int, int]]:
    """[first, stop) cut into blocks of at most `drop` positions and ROLL_BLOCK_BYTES, in order."""
    step = max(1, min(drop, ROLL_BLOCK_BYTES // max(1, bytes_per_position)))
    return [(a, min(a + step, stop)) for a in range(first, stop, step)]
