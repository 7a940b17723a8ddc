"""The small kernels around a beat that the resident controller releases (the `wpk` executor):

- `gate`: one program that holds a stream until the controller's work word reaches a run. The
  beat's prefix (its descriptor's copy, then `gather_frames`) is queued behind it a beat early,
  so the doorbell, not a host launch, starts the beat's work on the device.
- `gather_frames`: each row's two frames read straight out of the clients' ring of frames in
  host memory (`wave_actors.clock.shared_frames`, registered and mapped), checked against their stamps
  after the samples were read, as `FramesToRead.rows` checks them on the host: a place written
  again meanwhile is heard as silence and flagged in `torn` for the clock to count. The clock's
  loop then copies no audio at all: it names places.
- `frames_done`: the beat's completion, after its outputs were copied back: one release add to
  each frame's counter, which the controller waits for and publishes to the host.

The descriptor the host writes for a beat (`Descriptor`) is one int64 block: the row count,
then per row its slot, its generation, and per frame its place and number.
"""
from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from gpu.wpk.sync import ld_acquire_sys, wait_ge

SILENCE = -1                    # a frame number that names no frame (the jitter buffer's)
FIELDS = 6                      # slot, generation, place×2, number×2


@triton.jit(do_not_specialize=["target"])
def gate(work, target, IS_INTERP: tl.constexpr):
    """Returns once the int32 work word is at least `target` (the run this prefix belongs to)."""
    wait_ge(work, target, IS_INTERP)


@triton.jit
def frames_done(frame_ctr, IS_INTERP: tl.constexpr):
    """Both frames of the beat are done (stream order: everything before this kernel is)."""
    tl.atomic_add(frame_ctr, 1, sem="release", scope="gpu")
    tl.atomic_add(frame_ctr + 1, 1, sem="release", scope="gpu")


@triton.jit
def _fence_sys(IS_INTERP: tl.constexpr):
    """The samples' loads are ordered before the stamps' loads that follow."""
    if not IS_INTERP:
        tl.inline_asm_elementwise("fence.acq_rel.sys; mov.u32 $0, 0;", "=r", [],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def gather_frames(desc, number, generation, pcm, audio, torn, MAX_ROWS: tl.constexpr,
                  SAMPLES: tl.constexpr, BLOCK: tl.constexpr, IS_INTERP: tl.constexpr):
    """Program (i, f): row i's frame f into audio[slot, f] (`audio` [slots, 2, SAMPLES]), and
    torn[slot, f] = 1 where a frame's place no longer holds it. Rows past the descriptor's count
    do nothing (the grid is the largest beat's, queued before the count is known)."""
    i = tl.program_id(0)
    f = tl.program_id(1)
    n = tl.load(desc)
    if i < n:
        row = desc + 1 + i
        slot = tl.load(row)
        gen = tl.load(row + MAX_ROWS)
        place = tl.load(row + (2 + f) * MAX_ROWS)
        num = tl.load(row + (4 + f) * MAX_ROWS)
        offs = tl.arange(0, BLOCK)
        m = offs < SAMPLES
        x = tl.load(pcm + place * SAMPLES + offs, mask=m, other=0.0, volatile=True)
        _fence_sys(IS_INTERP)
        seen_num = ld_acquire_sys(number + place, IS_INTERP)
        seen_gen = ld_acquire_sys(generation + place, IS_INTERP)
        ok = (num == -1) | ((seen_num == num) & (seen_gen == gen))
        x = tl.where(ok, x, 0.0)
        tl.store(audio + (slot * 2 + f) * SAMPLES + offs, x, mask=m)
        tl.store(torn + slot * 2 + f, (ok == 0).to(tl.int32))


class Descriptor:
    """The host's view of a beat's descriptor block (a numpy view of pinned memory): `write`
    fills it from the slots in the beat and the places `FramesToRead` names."""

    def __init__(self, block: np.ndarray, max_rows: int):
        assert block.shape == (self.words(max_rows),) and block.dtype == np.int64
        self.block, self.max_rows = block, max_rows
        m = max_rows
        self.slot = block[1:1 + m]
        self.generation = block[1 + m:1 + 2 * m]
        self.place = block[1 + 2 * m:1 + 4 * m].reshape(2, m)
        self.number = block[1 + 4 * m:1 + 6 * m].reshape(2, m)

    @staticmethod
    def words(max_rows: int) -> int:
        return 1 + FIELDS * max_rows

    def write(self, slots: np.ndarray, frames=None) -> None:
        """The rows to read: `slots` in the beat; `frames` (a `FramesToRead`) or None for none."""
        if frames is None:
            self.block[0] = 0
            return
        n = len(slots)
        if n > self.max_rows:
            raise ValueError(f"{n} rows in a beat; the descriptor holds {self.max_rows}")
        self.slot[:n] = slots
        self.generation[:n] = frames.generations[slots]
        self.place[:, :n] = frames.places[slots].T
        self.number[:, :n] = frames.nums[slots].T
        self.block[0] = n

    def clear(self) -> None:
        self.block[0] = 0
