"""Frames of many sessions to the beat clock in one ZMQ message.

Each session used to send each 80 ms frame as its own message on its own socket: a send, a
receive and a header parse per frame on the clock's loop, two a session a beat. A `FrameBatcher`
gathers the frames its sessions cut during one turn of the loop and sends them as one message,

    [BATCH_TAG, headers (k records of HEADER: slot, generation, frame number), pcm (k × 1280 f32)]

which the clock reads with two `np.frombuffer` calls. The same message is what a worker process
sends the clock over ipc (docs/WORKERS.md), until the clock tells it where the engine's shared
ring of frames lies (`shared_frames`): from then on the batcher writes each frame, stamped,
straight into the ring as it is added, where the clock finds it at its next release (no message
at all), and only end-of-stream markers travel, as headers:

    [HEADS_TAG, headers]

A session's end-of-stream marker is a row with frame number END_OF_STREAM and no samples after its
frames, in the same batch order, so the clock still sees every frame of a closing session before
its marker (with a ring, the clock pulls the ring before it acts on a marker).
"""
from __future__ import annotations

import asyncio
from typing import Callable

import numpy as np
import zmq

from transports import zsock
from wave_actors.core.frames import SAMPLES_IN
from wave_actors.core.sched.session_table import END_OF_STREAM

BATCH_TAG = b"frames"
HEADS_TAG = b"heads"
HEADER = np.dtype([("slot", "<i4"), ("generation", "<i8"), ("frame", "<i8")])   # packed
_SILENT = np.zeros(SAMPLES_IN, np.float32)


def encode(rows: list[tuple[int, int, int]], pcm: list[np.ndarray]) -> list[bytes]:
    return [BATCH_TAG, np.array(rows, HEADER).tobytes(),
            np.concatenate(pcm).astype(np.float32, copy=False).tobytes()]


def encode_heads(rows: list[tuple[int, int, int]]) -> list[bytes]:
    return [HEADS_TAG, np.array(rows, HEADER).tobytes()]


def decode_heads(headers: bytes) -> np.ndarray | None:
    if len(headers) % HEADER.itemsize:
        return None
    return np.frombuffer(headers, HEADER)


def decode(headers: bytes, pcm: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """(headers, pcm [k, SAMPLES_IN]) as views of the message, or None when the parts disagree
    (not a batcher's message)."""
    if len(headers) % HEADER.itemsize:
        return None
    head = np.frombuffer(headers, HEADER)
    if len(pcm) != 4 * SAMPLES_IN * len(head):
        return None
    return head, np.frombuffer(pcm, np.float32).reshape(len(head), SAMPLES_IN)


class FrameBatcher:
    """Sends what its sessions `add` during one loop turn as one message at the turn's end (or
    at `flush`). A batch that cannot be sent (the clock is gone or restarting) is reported row
    by row through each row's `lost` callback, so every frame is heard or counted."""

    def __init__(self, tx: zsock.Tx, interval_s: float = 0.0):
        """`interval_s` > 0: a batch waits that long for more frames (a worker's, whose every
        message is read on the clock's loop), instead of leaving at the loop turn's end."""
        self._tx = tx
        self.interval_s = interval_s
        self._rows: list[tuple[int, int, int]] = []
        self._pcm: list[np.ndarray] = []
        self._lost: list[Callable[[], None] | None] = []
        self._due = False
        self.batches = 0
        self.ring = None            # a shared_frames.FramesView: samples go there, not here

    def use_ring(self, ring) -> None:
        """From now on write the samples into `ring` (None: send them in the messages again);
        what was added before goes first, as it was."""
        self.flush()
        self.ring = ring

    def add(self, slot: int, generation: int, frame_no: int, pcm: np.ndarray | None,
            lost: Callable[[], None] | None = None) -> None:
        """A frame (pcm: SAMPLES_IN float32), or with pcm None an end-of-stream marker."""
        if self.ring is not None and pcm is not None:
            self.ring.write(slot, generation, frame_no, pcm)
            return
        self._rows.append((slot, generation, frame_no))
        if self.ring is None:
            self._pcm.append(_SILENT if pcm is None else pcm)
        self._lost.append(lost)
        if not self._due:
            self._due = True
            loop = asyncio.get_running_loop()
            if self.interval_s > 0:
                loop.call_later(self.interval_s, self._flush_due)
            else:
                loop.call_soon(self._flush_due)

    def end_stream(self, slot: int, generation: int) -> bool:
        """The session's marker after its frames, sent now: False when it could not be."""
        self.add(slot, generation, END_OF_STREAM, None)
        return self.flush()

    def _flush_due(self) -> None:
        if self._due:
            self.flush()

    def flush(self) -> bool:
        self._due = False
        if not self._rows:
            return True
        rows, pcm, lost = self._rows, self._pcm, self._lost
        self._rows, self._pcm, self._lost = [], [], []
        try:
            self._tx.send(encode(rows, pcm) if self.ring is None else encode_heads(rows))
        except zmq.ZMQError:
            for count in lost:
                if count is not None:
                    count()
            return False
        self.batches += 1
        return True
