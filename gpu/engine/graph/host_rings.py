"""The graph executor's host rings: pinned, so the clock packs straight into memory the device
copies by DMA. Output rings the caller owns (shared with the session workers) are page-locked
in place instead."""
from __future__ import annotations

import logging

import numpy as np
import torch

from wave_actors.core.contract import MAX_USER_TOKENS, NO_TOKEN, BeatInput, BeatOutput
from wave_actors.core.frames import FRAMES_PER_BEAT, SAMPLES_IN, SAMPLES_OUT

log = logging.getLogger("wave.graph_executor")

OUTPUTS = ("pcm", "text", "func", "user")


class PinnedRings:
    def __init__(self, rows: int):
        self.rows = rows
        self._pinned: dict[int, torch.Tensor] = {}        # a ring array's address → its tensor
        self._registered: list[int] = []                  # host memory we page-locked

    def _pin(self, shape: tuple, dtype: torch.dtype, fill=0) -> np.ndarray:
        t = torch.full(shape, fill, dtype=dtype, pin_memory=True)
        arr = t.numpy()
        self._pinned[arr.ctypes.data] = t
        return arr

    def alloc_input(self) -> BeatInput:
        return BeatInput(self._pin((self.rows, FRAMES_PER_BEAT, SAMPLES_IN), torch.float32),
                         np.zeros(self.rows, bool))

    def alloc_output(self, into: BeatOutput | None = None) -> BeatOutput:
        if into is not None:
            for name in OUTPUTS:
                self._register(getattr(into, name))
            return into
        s, f = self.rows, FRAMES_PER_BEAT
        return BeatOutput(self._pin((s, f, SAMPLES_OUT), torch.float32),
                          self._pin((s, f), torch.int32), self._pin((s, f), torch.int32),
                          self._pin((s, f, MAX_USER_TOKENS), torch.int32, NO_TOKEN))

    def _register(self, arr: np.ndarray) -> None:
        """Host memory the caller owns (shared with the workers) page-locked for the driver,
        so the beat's copies into it are DMA as into our own pinned rings. Where the driver
        refuses, the copies still land, only synchronously."""
        if arr.ctypes.data in self._registered:          # a later clock's, same buffers
            return
        err = int(torch.cuda.cudart().cudaHostRegister(arr.ctypes.data, arr.nbytes, 0))
        if err:
            log.warning("cudaHostRegister of %d bytes failed (cudaError %d): outputs are "
                        "copied through pageable memory", arr.nbytes, err)
        else:
            self._registered.append(arr.ctypes.data)
        self._pinned[arr.ctypes.data] = torch.from_numpy(arr)

    def tensor(self, arr: np.ndarray) -> torch.Tensor:
        """The pinned tensor behind a ring array (a plain view if it is not one of ours)."""
        t = self._pinned.get(arr.ctypes.data)
        return t if t is not None and t.shape == arr.shape else torch.from_numpy(arr)

    def outputs_from(self, d_out: dict[str, torch.Tensor], out: BeatOutput, hi: int) -> None:
        """The device outputs' rows up to `hi` queued into `out`'s rings (nothing waited for)."""
        for name in OUTPUTS:
            self.tensor(getattr(out, name))[:hi].copy_(d_out[name][:hi], non_blocking=True)

    def close(self) -> None:
        """Unlock what was page-locked (after the device's last copy into it)."""
        for ptr in self._registered:
            torch.cuda.cudart().cudaHostUnregister(ptr)
            self._pinned.pop(ptr, None)
        self._registered.clear()
