"""The beat's output buffers in shared memory: the engine's executor fills them in place and the
clock sends each worker only its rows' headers; the worker copies its sessions' PCM rows out of
the buffer itself, in its own process, so the clock's release-to-routed time carries no copy
of the audio.

A buffer is refilled by the beat after next. Each buffer has a stamp: -1 while the executor may
be writing it, else the number of the fill it holds. The clock clears the stamp before it hands
the buffer to the executor and sets it once the beat is collected; a worker copies its rows,
then reads the stamp again, and a stamp that changed means the copy may be torn: the rows are
dropped and counted, never delivered. (Stores and loads are taken to stay in order, as x86 keeps
them: the stamp's store precedes the executor's writes, a reader's data loads precede its
stamp load; on other hosts the outputs are not shared, `shm_segment.unordered_host`.)

The segment (`shm_segment`) is the engine process's; workers map it read-only by name.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from wave_actors.core.contract import MAX_USER_TOKENS, NO_TOKEN, BeatOutput
from wave_actors.core.frames import FRAMES_PER_BEAT, SAMPLES_OUT
from wave_actors.clock.shm_segment import Segment, close_map, open_map, page_up, unordered_host

log = logging.getLogger(__name__)


@dataclass
class BeatOut:
    """What the clock sends a session after a beat: its header and its PCM row."""
    header: dict
    pcm: np.ndarray          # [frames, SAMPLES_OUT] float32, a row of the beat's output copy


DEPTH = 2               # the clock's ring of output buffers: beat k fills buffer k % 2
STALE = -1              # a buffer's stamp while the executor may write it
# BeatOutput's arrays: name, shape after the slot axis, dtype, fill.
FIELDS = (("pcm", (FRAMES_PER_BEAT, SAMPLES_OUT), np.float32, 0.0),
          ("text", (FRAMES_PER_BEAT,), np.int32, 0),
          ("func", (FRAMES_PER_BEAT,), np.int32, 0),
          ("user", (FRAMES_PER_BEAT, MAX_USER_TOKENS), np.int32, NO_TOKEN))


def layout(slots: int, depth: int) -> tuple[int, list[dict[str, tuple[int, tuple, type]]]]:
    """The segment's size and, per buffer, each array's (offset, shape, dtype). Every array
    starts on a page of its own, so each can be registered with the GPU driver on its own; the
    stamps (int64 [depth]) lie at offset 0."""
    at = page_up(8 * depth)
    buffers = []
    for _ in range(depth):
        arrays = {}
        for name, shape, dtype, _fill in FIELDS:
            shape = (slots, *shape)
            arrays[name] = (at, shape, dtype)
            at = page_up(at + int(np.prod(shape)) * np.dtype(dtype).itemsize)
        buffers.append(arrays)
    return at, buffers


def _arrays(buf, slots: int, depth: int) -> tuple[np.ndarray, list[BeatOutput]]:
    _size, buffers = layout(slots, depth)
    stamps = np.frombuffer(buf, np.int64, depth, 0)
    outs = [BeatOutput(**{name: np.frombuffer(buf, dtype, int(np.prod(shape)), at).reshape(shape)
                          for name, (at, shape, dtype) in arrays.items()})
            for arrays in buffers]
    return stamps, outs


class SharedOutputs:
    """The engine's side: creates the segment and stamps its buffers."""

    def __init__(self, slots: int, depth: int = DEPTH):
        self.slots, self.depth = slots, depth
        size, _ = layout(slots, depth)
        self._segment = Segment.create("wave-out", size)
        self.name = self._segment.name
        self.stamps, self.outputs = _arrays(self._segment.map, slots, depth)
        for out in self.outputs:             # every page written now: none faults in a beat
            for name, _shape, _dtype, fill in FIELDS:
                getattr(out, name)[:] = fill
        self.stamps[:] = STALE
        self._fills = 0

    @classmethod
    def create(cls, slots: int, depth: int = DEPTH) -> "SharedOutputs | None":
        """The segment, or None where shared memory is missing or too small (the clock then
        copies each worker's rows into its message)."""
        why = unordered_host()
        if why is not None:
            log.warning("outputs are not shared with the workers (%s): the clock copies them", why)
            return None
        try:
            return cls(slots, depth)
        except (OSError, ValueError) as exc:
            log.warning("outputs are not shared with the workers (%s): the clock copies them", exc)
            return None

    def refilling(self, index: int) -> None:
        """Before the executor may write buffer `index`: readers of its last fill now fail."""
        self.stamps[index] = STALE

    def filled(self, index: int) -> int:
        """Buffer `index` holds a beat's outputs: the number readers check their copy against."""
        self._fills += 1
        self.stamps[index] = self._fills
        return self._fills

    def clear(self) -> None:
        """A new clock: no fill of an older one is read again."""
        self.stamps[:] = STALE

    def close(self) -> None:
        if self.outputs is None:
            return
        self.stamps = self.outputs = None
        self._segment.close()


class OutputsView:
    """A worker's read-only map of the engine's segment."""

    def __init__(self, name: str, slots: int, depth: int):
        self.name, self.slots, self.depth = name, slots, depth
        self._map = open_map(name, layout(slots, depth)[0])
        self._stamps, outs = _arrays(self._map, slots, depth)
        self._pcm = [o.pcm for o in outs]

    def take(self, index: int, fill: int, rows: np.ndarray) -> np.ndarray | None:
        """A copy of buffer `index`'s PCM rows if it still holds fill `fill`, else None."""
        if not 0 <= index < self.depth or self._stamps[index] != fill:
            return None
        pcm = np.take(self._pcm[index], rows, axis=0, mode="clip")
        return pcm if self._stamps[index] == fill else None

    def close(self) -> None:
        self._stamps = self._pcm = None
        close_map(self._map)
