"""The clients' frames in shared memory: a session worker writes each frame's samples into a place
of its slot's ring in a segment the engine process made, and sends the clock nothing for it. At
each release the clock's session table pulls every slot's next frames out of the ring
(`SessionTable.pull_ring`) and its pack gathers their samples straight from the ring into the
executor's input, or, for an executor that reads them where they lie (`Capabilities
.reads_frames`: the sim's hearing thread, as a device would read mapped host memory), only
names their places. The clock receives no frame on the way in (at 1,000 sessions that was a
10 MB receive and copy a beat), and with such an executor copies none either.

Frame n of a slot lies in place `1 + slot * ring + n % ring`; place 0 is silence. Each place is
stamped with the generation and number of the frame it holds: a worker marks the place empty
(number -1), writes the samples, then the generation and the number; whoever reads a place
checks its stamp after reading the samples (the clock's gather, or `FramesToRead.rows` on the
executor's thread, whose finds the clock counts at collect). A frame whose place was written
again before its beat (a slot more than a ring of frames behind, or an older session's) fails
that check and is heard as silence, counted as dropped: never someone else's audio, never a
torn frame. (Stores and loads are taken to stay in order, as x86 keeps them: on other hosts
the ring is not shared, `shm_segment.unordered_host`.)

The ring holds the jitter buffer's bound and two beats more (`ring_for`): a frame's place is
rewritten only after the buffer would have dropped it anyway, unless frame numbers skip.
"""
from __future__ import annotations

import logging

import numpy as np

from wave_actors.core.frames import FRAMES_PER_BEAT, SAMPLES_IN
from wave_actors.clock.shm_segment import Segment, close_map, open_map, page_up, unordered_host

log = logging.getLogger(__name__)

EMPTY = -1              # a place's number while a writer fills it (and before any frame)
SILENT = 0              # the place that always holds zeros


def ring_for(max_queue: int) -> int:
    """Places a slot: the jitter buffer's bound, a beat being packed, and a beat in flight."""
    return max_queue + 2 * FRAMES_PER_BEAT


def layout(slots: int, ring: int) -> tuple[int, dict[str, tuple[int, tuple, type]]]:
    """The segment's size and each array's (offset, shape, dtype), each on pages of its own."""
    places = 1 + slots * ring
    at, arrays = 0, {}
    for name, shape, dtype in (("number", (places,), np.int64),
                               ("generation", (places,), np.int64),
                               ("pcm", (places, SAMPLES_IN), np.float32)):
        arrays[name] = (at, shape, dtype)
        at = page_up(at + int(np.prod(shape)) * np.dtype(dtype).itemsize)
    return at, arrays


class FrameRing:
    """The segment's arrays and what both sides compute with them."""

    def __init__(self, buf, slots: int, ring: int):
        self.slots, self.ring = slots, ring
        _size, arrays = layout(slots, ring)
        for name, (at, shape, dtype) in arrays.items():
            setattr(self, name, np.frombuffer(buf, dtype, int(np.prod(shape)), at).reshape(shape))

    def places(self, slots: np.ndarray, numbers: np.ndarray) -> np.ndarray:
        return 1 + slots.astype(np.int64) * self.ring + numbers % self.ring

    def write(self, slot: int, generation: int, number: int, pcm: np.ndarray) -> None:
        """One frame into its place, stamped last (a worker's, as its session cuts the frame)."""
        place = 1 + slot * self.ring + number % self.ring
        self.number[place] = EMPTY
        self.pcm[place] = pcm
        self.generation[place] = generation
        self.number[place] = number

    def write_rows(self, places: np.ndarray, generations: np.ndarray, numbers: np.ndarray,
                   pcm: np.ndarray) -> None:
        """Rows into their places (the clock's, for frames that came with their samples)."""
        self.number[places] = EMPTY
        self.pcm[places] = pcm
        self.generation[places] = generations
        self.number[places] = numbers

    def holds(self, places: np.ndarray, generations: np.ndarray, numbers: np.ndarray
              ) -> np.ndarray:
        """Whether each place still holds the frame named (read after its samples were)."""
        return (self.number[places] == numbers) & (self.generation[places] == generations)


class SharedFrames(FrameRing):
    """The engine's side: creates the segment (every page written now: none faults in a beat)."""

    def __init__(self, slots: int, ring: int):
        self._segment = Segment.create("wave-in", layout(slots, ring)[0])
        self.name = self._segment.name
        super().__init__(self._segment.map, slots, ring)
        self.pcm[:] = 0.0
        self.clear()

    def clear(self) -> None:
        """A new clock: no frame written for an older one is found again. (Generations are
        unique within a node, but an engine may serve one node after another, as the bench's
        runs do, and their generations repeat.)"""
        self.generation[:] = -1
        self.number[:] = EMPTY

    @classmethod
    def create(cls, slots: int, ring: int) -> "SharedFrames | None":
        """The segment, or None where shared memory is missing or too small (workers then send
        each frame's samples in their messages, and the clock queues copies)."""
        why = unordered_host()
        if why is not None:
            log.warning("frames are not shared with the workers (%s): they send copies", why)
            return None
        try:
            return cls(slots, ring)
        except (OSError, ValueError) as exc:
            log.warning("frames are not shared with the workers (%s): they send copies", exc)
            return None

    def close(self) -> None:
        if self._segment is None:
            return
        for name in ("number", "generation", "pcm"):
            setattr(self, name, None)
        self._segment.close()
        self._segment = None


class FramesView(FrameRing):
    """A worker's map of the engine's segment, to write its sessions' frames into."""

    def __init__(self, name: str, slots: int, ring: int):
        self.name = name
        self._map = open_map(name, layout(slots, ring)[0], writable=True)
        super().__init__(self._map, slots, ring)

    def close(self) -> None:
        for name in ("number", "generation", "pcm"):
            setattr(self, name, None)
        close_map(self._map)
