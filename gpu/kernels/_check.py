"""Argument checks shared by the kernel launchers (shapes, dtypes, strides, slot maps).

Launchers call these before every launch; they read only tensor metadata, never device values,
so a launcher never synchronises (habit 4). Slot *values* are checked on the host only when the
slot map lives on the CPU (tests, the interpreter); on the GPU each kernel carries a
`tl.device_assert` on its slot, compiled in under TRITON_DEBUG=1.
"""
from __future__ import annotations

import torch

FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def check(name: str, t: torch.Tensor, shape: tuple, dtypes, *, contiguous: bool = True,
          device: torch.device | None = None) -> None:
    """Assert `t` has exactly `shape` (None = any size), one of `dtypes`, and is contiguous."""
    assert isinstance(t, torch.Tensor), f"{name}: expected a tensor, got {type(t).__name__}"
    assert t.dim() == len(shape), f"{name}: expected {len(shape)} dims {shape}, got {tuple(t.shape)}"
    for i, (got, want) in enumerate(zip(t.shape, shape)):
        assert want is None or got == want, f"{name}: dim {i} is {got}, expected {want} ({tuple(t.shape)} vs {shape})"
    if isinstance(dtypes, torch.dtype):
        dtypes = (dtypes,)
    assert t.dtype in dtypes, f"{name}: dtype {t.dtype}, expected one of {dtypes}"
    if contiguous:
        assert t.is_contiguous(), f"{name}: must be contiguous (strides {t.stride()})"
    if device is not None:
        assert t.device == device, f"{name}: on {t.device}, expected {device}"


def check_slots(slots: torch.Tensor, batch: int, max_slots: int, device: torch.device) -> None:
    """slots: int32[batch], distinct, each in [0, max_slots). Values checked only on the CPU."""
    check("slots", slots, (batch,), torch.int32, device=device)
    assert batch >= 1, "empty batch"
    if slots.device.type == "cpu":
        vals = slots.tolist()
        assert all(0 <= s < max_slots for s in vals), f"slots {vals} out of range [0, {max_slots})"
        assert len(set(vals)) == len(vals), f"slots {vals} repeat: two rows would race on one state"


INDEX = (torch.int32, torch.int64)


def check_index_slots(slots: torch.Tensor, batch: int, max_slots: int, device: torch.device) -> None:
    """`check_slots` for a slot map of int32 or int64 (the kernels that load either as it is
    spare the talker's int64 slots a cast launch)."""
    check("slots", slots, (batch,), INDEX, device=device)
    if slots.device.type == "cpu":
        check_slots(slots.to(torch.int32), batch, max_slots, device)


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
