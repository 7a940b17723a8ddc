"""The beat clock's way in for frames: batches read off its socket (on a timer, or as they
come with a shared ring), or the session workers' writes pulled from the ring, queued in the
session table's jitter buffers; each session's end-of-stream marker resolved for the release
that waits on it. Counts what it read since the last release and what it dropped.
"""
from __future__ import annotations

import asyncio
import math

import numpy as np
import zmq

from transports import zsock
from wave_actors.clock import frame_batch
from wave_actors.clock.view import ClockView
from wave_actors.core.contract import Handle
from wave_actors.core.frames import BEAT_S
from wave_actors.core.sched.session_table import END_OF_STREAM

# The frame reads' last before a hold ends this long before it: a read due at the hold's very
# start could run inside it.
READ_BEFORE_HOLD_S = 0.5e-3


class FramesIn:
    def __init__(self, actor: ClockView, ring=None):
        self.actor, self.ring = actor, ring
        self.count = 0                  # frames read since the last release
        self._stream_ends: dict[Handle, asyncio.Future] = {}   # END_OF_STREAM seen (closing)

    def took(self) -> int:
        """Frames read since the last call (a release's `BeatRecord.frames_read`)."""
        n, self.count = self.count, 0
        return n

    def forget(self, handle: Handle) -> None:
        self._stream_ends.pop(handle, None)

    def stop(self) -> None:
        for fut in self._stream_ends.values():
            if not fut.done():
                fut.set_result(False)

    def stream_end(self, handle: Handle) -> asyncio.Future:
        fut = self._stream_ends.get(handle)
        if fut is None:
            fut = self._stream_ends[handle] = asyncio.get_running_loop().create_future()
        return fut

    async def run(self) -> None:
        every = self.reads_every
        if every:
            while True:                       # all that waits, every `every`
                await self.actor.clock.sleep_until(self.next_read(every))
                if self.actor.reads_wait_out_hold and self.actor.turns.held:
                    # From just before a release until its beat is queued, frames wait on the
                    # socket: the release drains them itself, and reading them here would only
                    # stand between the loop and the release.
                    await self.actor.turns.turn()
                self.take(self._recv_all())
        async for batch in zsock.batches(self.actor.tx):    # on arrival
            self.take(batch)
            if self.actor.reads_wait_out_hold and self.actor.turns.held:
                await self.actor.turns.turn()

    def _recv_all(self) -> list[list]:
        sync, messages = self.actor.tx.sync, []
        while True:
            try:
                messages.append(zsock.recv_now(sync))
            except zmq.Again:
                return messages

    def next_read(self, every: float) -> float:
        """`every` from now, or just before the next release's hold if that comes first: the
        release then drains only what arrived during its hold."""
        actor = self.actor
        now, hold, t0 = actor.clock.now(), actor.policy.release_hold_s, actor.t0
        if t0 is None or not (actor.reads_wait_out_hold and hold):
            return now + every
        hold_start = t0 + math.floor((now + hold - t0) / BEAT_S + 1) * BEAT_S - hold
        before = hold_start - READ_BEFORE_HOLD_S
        return before if now < before < now + every else now + every

    def drain(self) -> None:
        """Every frame queued on the socket now, without yielding to the loop (the sessions'
        batch of this turn sent first)."""
        if self.actor.frames is not None:
            self.actor.frames.flush()
        self.take(self._recv_all())
        self.pull_ring()
        self.actor.tx.kick()      # the reads may have consumed the socket's edge: look again

    def take(self, messages: list[list]) -> None:
        """Frame batches read off the socket together, queued as one (a batch's queueing costs
        about the same whatever its size): each run of messages of one kind (samples in the
        message, or headers of frames in the shared ring) as one, in the order they came."""
        heads, pcms, ringed = [], [], False
        for frames in messages:
            batch, in_ring = None, False
            if len(frames) == 4 and frames[1] == frame_batch.BATCH_TAG:
                batch = frame_batch.decode(frames[2], frames[3])
            elif len(frames) == 3 and frames[1] == frame_batch.HEADS_TAG:
                head = frame_batch.decode_heads(frames[2])
                if head is not None and self.ring is None:
                    # Frames in a ring this clock has none of (its sender was told of another
                    # engine's): lost, counted; told to send the samples from now on.
                    self.actor.stats.dropped_frames += len(head)
                    self.actor.route.greet(frames[0], force=True)
                    continue
                batch, in_ring = (None if head is None else (head, None)), True
            if batch is None:                 # not a FrameBatcher's message
                self.actor.stats.dropped_frames += 1
                continue
            self.actor.route.greet(frames[0])
            if heads and in_ring != ringed:
                self._queue_run(heads, pcms, ringed)
                heads, pcms = [], []
            ringed = in_ring
            heads.append(batch[0])
            pcms.append(batch[1])
        if heads:
            self._queue_run(heads, pcms, ringed)

    def _queue_run(self, heads: list[np.ndarray], pcms: list, ringed: bool) -> None:
        if ringed:
            self._batch_in(heads[0] if len(heads) == 1 else np.concatenate(heads), None)
        elif len(heads) == 1:
            self._batch_in(heads[0], pcms[0])
        else:                                 # the samples stay in their messages' buffers
            self._batch_in(np.concatenate(heads), pcms)

    @property
    def reads_every(self) -> float:
        """How often frame messages are read (0: as they come). With a shared ring the workers
        send only end-of-stream markers (and each its first batch): read as they come, a timer
        would wake the loop for nothing."""
        return 0.0 if self.ring is not None else self.actor.policy.frames_every_s

    def pull_ring(self) -> None:
        """Frames the session workers wrote into the shared ring, queued."""
        if self.ring is not None:
            self.count += self.actor.slots.table.pull_ring()

    def _batch_in(self, head: np.ndarray, rows: np.ndarray | list[np.ndarray] | None) -> None:
        """`rows`: the frames' samples (or their pieces in order); None: in the shared ring."""
        frame_nos = head["frame"]
        ends = frame_nos == END_OF_STREAM
        if ends.any():                        # a session's last frames: markers one by one
            self.pull_ring()                  # (its frames in the ring came before its marker)
            for slot, generation, _end in head[ends].tolist():
                self._ended(Handle(slot, generation))
            keep = ~ends
            if isinstance(rows, list):
                rows = np.concatenate(rows)
            head, frame_nos = head[keep], frame_nos[keep]
            rows = None if rows is None else rows[keep]
        refused = self.actor.slots.table.push_batch(head["slot"], head["generation"], frame_nos,
                                                    rows)
        self.actor.stats.dropped_frames += refused
        self.count += len(head) - refused

    def _ended(self, handle: Handle) -> None:
        """A session's end-of-stream marker: its last frame is in."""
        ended = self._stream_ends.get(handle)
        if ended is None and self.actor.slots.holds(handle):
            ended = self.stream_end(handle)
        if ended is not None and not ended.done():
            ended.set_result(True)
