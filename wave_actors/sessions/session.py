"""SessionActor: one per live conversation, between its client and the beat clock.

Inbound: reorder `audio` by `seq`, waiting a short time at most for a missing one
(`ReorderBuffer`), decode the wire format, resample once to 16 kHz (a streaming soxr
resampler), cut 80 ms frames and send each, numbered and naming the session's handle, to the
clock over ZMQ (inproc). Outbound: the clock puts each beat's outputs in this actor's mailbox;
`SessionOutput` turns each of its two frames into `audio`, `text` and `function_call`
messages.

Every input is accounted for: frames reach the clock, or are counted. Drops of every kind
(duplicate or stale seq, seq gap, bad payload, mailbox overflow, flood limit, audio unheard at
close) are summed in samples at the client's rate and reported as 80 ms frames (`input_drops`),
so `closed.stats` counts frames whatever the client's message sizes were.

The actor does not know where its client is: it sends through `send(frames, droppable)`, which
the node routes to the connection the session is bound to (or holds while it is detached).
"""
from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import numpy as np

from transports import audio as A
from transports import protocol as P
from wave_actors.core.contract import TextCodec
from wave_actors.core.frames import BEAT_S, FRAME_S, IN_RATE, SAMPLES_IN
from wave_actors.core.function_calls import result_tokens
from wave_actors.core.reorder import Reach, Released, ReorderBuffer, SkipLedger
from wave_actors.core.timebase import Clock
from wave_actors.runtime.actors import Actor, ActorStopped
from wave_actors.clock.frame_batch import FrameBatcher
from wave_actors.clock.shared_outputs import BeatOut
from wave_actors.runtime.turns import Turn
from wave_actors.sessions.messages import (AudioIn, Close, FunctionResult, GapDue,
                                           SessionConfig, SessionCounters)
from wave_actors.sessions.session_output import SessionOutput

# In the reorder buffer, the place of an audio message dropped before it (`_mark_lost`).
LOST = object()

log = logging.getLogger("wave.session")

# Tool-result tokens a session may have waiting (the model hears one a frame): the largest
# result the protocol admits fits, a stream of them does not.
TOOL_BACKLOG = P.MAX_INSTRUCTIONS + 4096


@dataclass
class _OutputFailed:
    exc: Exception


class SessionActor(Actor):
    audio_cap = 256

    def __init__(self, cfg: SessionConfig, frames: Callable[[], FrameBatcher | None],
                 send: Callable[..., bool],
                 text_codec: TextCodec, user_codec: TextCodec, clock: Clock,
                 on_close: Callable[["SessionActor", Close], Any],
                 on_function_tokens: Callable[["SessionActor", list[int]], None],
                 run_output: Callable[[Callable[[], None]], Turn | None] | None = None,
                 input_turn: Callable[[], Awaitable[None]] | None = None):
        super().__init__(f"session:{cfg.session}")
        self.cfg, self.clock = cfg, clock
        # The batcher of the clock this session was admitted to (None while it is not running):
        # frames of a session whose clock went away are counted here, not sent to the next one.
        self._frames = frames
        self._send, self._on_close = send, on_close
        self._on_function_tokens = on_function_tokens
        self._handle = (cfg.handle.slot, cfg.handle.generation)
        # The clock's OutputTurns.run: a beat's output work runs in its turn, not across a
        # release; what waits is kept in order, to be sent before `closed` (`flush_outputs`).
        self._run_output = run_output
        self._queued_out: collections.deque[Turn] = collections.deque()
        self._input_turn = input_turn       # the same, where the clock policy holds inputs
        self._text_codec = text_codec
        self.counters = SessionCounters()
        self.mailbox.on_drop = self._count_mailbox_drop
        self._reorder = ReorderBuffer(reach=Reach())      # the wait learns the path's reordering
        self._out_frame = 0             # the model's frame after the latest output heard
        self._tool_heard_by = 0         # the frame by which every tool token sent is heard
        self._skips = SkipLedger()
        self._gap_timer: asyncio.Task | None = None
        self._in_resampler = A.StreamResampler(cfg.sample_rate, IN_RATE)
        self._pending = np.zeros(0, np.float32)
        self._frame_no = 0
        self._held: collections.deque[np.ndarray] = collections.deque()
        self._t0: float | None = None   # when the first frame was cut: the input's real time
        self._heard = False             # a beat of this session's has run
        self._overflowing = False       # an overflow was told; told again after it ends
        self._output = SessionOutput(cfg, send, text_codec, user_codec, self.counters)
        self._bps = P.BYTES_PER_SAMPLE[cfg.format]
        self.closing = False

    def _count_mailbox_drop(self, msg: Any) -> None:
        if isinstance(msg, AudioIn):
            self.counters.dropped_in_mailbox += 1
            self._drop_samples(len(msg.payload))
            self._mark_lost(msg.seq)

    def count_flooded(self, payload: bytes, seq: int | None = None) -> None:
        """An audio message of this session that the node's flood limit dropped."""
        self.counters.flooded += 1
        self._drop_samples(len(payload))
        if seq is not None:
            self._mark_lost(seq)

    def _mark_lost(self, seq: int) -> None:
        """A message dropped, and counted, before it reached the reorder buffer: its place there
        is filled with a marker that is released like audio but heard as nothing, so the gap it
        leaves is not given up on and counted lost a second time."""
        if self._reorder.in_order(seq):
            return
        out = self._reorder.push(seq, LOST, self.clock.now())
        if out.rejected:
            # Its gap was given up on already and counted at an estimate; the drop has just
            # counted its real size.
            self.counters.dropped_samples -= self._skips.take(seq) or 0
        self._take(out)

    def _drop_samples(self, nbytes: int) -> None:
        self.counters.dropped_samples += -(-nbytes // self._bps)

    @property
    def expected_seq(self) -> int:
        """The next input `seq` this session waits for (what a resuming client sends next)."""
        return self._reorder.next_seq

    @property
    def out_seq(self) -> int:
        """The `seq` of the next output audio message."""
        return self._output.seq

    # -- lifecycle --------------------------------------------------------------------------------
    async def on_stop(self) -> None:
        for turn in self._queued_out:         # nothing of a stopped session runs later
            turn.cancel()
        self._queued_out.clear()
        if self._gap_timer is not None:
            # Dropped as well as cancelled: its end (a traceback holding this session) and
            # this reference would make a cycle that only a full collection frees.
            self._gap_timer.cancel()
            self._gap_timer = None
        self.mailbox.on_drop = None           # a bound method of this actor: a cycle

    # -- messages ---------------------------------------------------------------------------------
    async def handle(self, msg: Any) -> Any:
        if isinstance(msg, AudioIn):
            if self._input_turn is not None:     # not across a release either
                await self._input_turn()
            self._on_audio(msg)
        elif isinstance(msg, BeatOut):
            if self._run_output is None:
                self._on_beat(msg)
            elif (turn := self._run_output(lambda: self._beat_in_turn(msg))) is not None:
                self._queued_out.append(turn)
        elif isinstance(msg, _OutputFailed):
            raise msg.exc
        elif isinstance(msg, GapDue):
            self._take(self._reorder.due(self.clock.now()))
        elif isinstance(msg, FunctionResult):
            self._tool_result(result_tokens(self._text_codec, msg.output))
        elif isinstance(msg, Close):
            await self._on_close(self, msg)
        else:
            raise TypeError(f"unexpected message {type(msg).__name__}")

    def _on_audio(self, msg: AudioIn) -> None:
        self.counters.messages_in += 1
        if self._reorder.in_order(msg.seq):
            self._ingest(msg.payload)
            return
        if msg.seq > self._reorder.next_seq:
            self.counters.reordered += 1
        out = self._reorder.push(msg.seq, msg.payload, self.clock.now())
        if out.rejected:
            self._reject(msg)
        self._take(out)

    def _reject(self, msg: AudioIn) -> None:
        c = self.counters
        self._drop_samples(len(msg.payload))
        estimate = self._skips.take(msg.seq)
        if estimate is None:
            c.duplicates += 1
            self._error(P.BAD_SEQ, f"seq {msg.seq} is a duplicate or arrived after its turn "
                                   f"(expected {self._reorder.next_seq}); dropped")
            return
        # Counted lost at an estimate when its gap was given up on: now at its real size.
        c.after_gap += 1
        c.dropped_samples -= estimate
        self._error(P.BAD_SEQ, f"seq {msg.seq} arrived after the wait for it had ended "
                               f"(expected {self._reorder.next_seq}); dropped, counted once")

    def _take(self, out: Released) -> None:
        if out.skipped:
            self._skip(out.skipped)
        for payload in out.items:
            if payload is not LOST:
                self._ingest(payload)
        deadline = self._reorder.deadline()
        if deadline is not None and self._gap_timer is None:
            self._gap_timer = asyncio.get_running_loop().create_task(self._gap_due(deadline))

    async def _gap_due(self, deadline: float) -> None:
        """A gap's wait ends at `deadline`: the mailbox gets `GapDue`, so the skip happens in
        order with the session's other messages."""
        await self.clock.sleep(max(0.0, deadline - self.clock.now()))
        self._gap_timer = None
        try:
            self.tell(GapDue())
        except ActorStopped:
            pass

    def _skip(self, skipped: tuple[range, ...]) -> None:
        """Seqs given up on: their audio is unknown, so each counts as a message of the mean
        size taken so far (a frame when nothing was taken yet), remembered in case it comes."""
        c = self.counters
        taken = (c.messages_in - c.duplicates - c.after_gap - c.bad_payloads
                 - self._reorder.held())
        each = round(c.samples_in / taken if taken > 0 and c.samples_in
                     else self.cfg.frame_samples)
        for seqs in skipped:
            c.seq_gaps += len(seqs)
            c.dropped_samples += len(seqs) * each
            self._skips.add(seqs, each)

    def _ingest(self, payload: bytes) -> None:
        if len(payload) % self._bps:
            self.counters.bad_payloads += 1
            self._drop_samples(len(payload))
            self._error(P.BAD_PAYLOAD, f"audio payload of {len(payload)} bytes is not a whole "
                                       f"number of {self.cfg.format} samples; dropped")
            return
        self.counters.samples_in += len(payload) // self._bps
        x = self._in_resampler(A.decode(payload, self.cfg.format))
        pending = np.concatenate([self._pending, x]) if len(self._pending) else x
        n = len(pending) // SAMPLES_IN
        if n and self._t0 is None:
            self._t0 = self.clock.now()
        c, room = self.counters, self.cfg.hold_frames - len(self._held)
        for i in range(n):
            if i < room:
                self._held.append(pending[i * SAMPLES_IN:(i + 1) * SAMPLES_IN])
            else:
                c.held_overflow += 1
                c.dropped_samples += round(self.cfg.frame_samples)
        if n > room and not self._overflowing:
            self._overflowing = True
            self._error(P.INPUT_OVERFLOW, f"input is {self.cfg.hold_frames * 80 / 1000:g} s "
                        "ahead of the model, which hears it in real time; frames past that are "
                        "dropped (counted) until it catches up")
        elif n and n <= room:
            self._overflowing = False
        self._pending = pending[n * SAMPLES_IN:].copy()
        self._release()
        c.held_high = max(c.held_high, len(self._held))

    def _release(self) -> None:
        """Held frames to the clock up to real time (counted from the first frame) plus
        `lead_frames`; called as input comes and at every beat's outputs."""
        if not self._held:
            return
        due = int((self.clock.now() - self._t0) / FRAME_S) + 1 + self.cfg.lead_frames
        n = min(len(self._held), due - self._frame_no)
        if n <= 0:
            return
        batcher = self._frames()
        for _ in range(n):
            frame = self._held.popleft()
            if batcher is None:
                self.counters.engine_unavailable += 1     # the clock is restarting
            else:
                batcher.add(*self._handle, self._frame_no, frame, self._engine_lost)
            self._frame_no += 1

    def _beat_in_turn(self, msg: BeatOut) -> None:
        while self._queued_out and not self._queued_out[0].pending:
            self._queued_out.popleft()
        try:
            self._on_beat(msg)
        except Exception as exc:      # fails the actor, as a failure in `handle` does
            try:
                self.tell(_OutputFailed(exc))
            except ActorStopped:
                log.exception("output work of a stopped session failed")

    def flush_outputs(self) -> None:
        """At close: outputs still waiting for their turn are sent now, before `closed`."""
        while self._queued_out:
            self._queued_out.popleft().run_now()

    def _on_beat(self, msg: BeatOut) -> None:
        if not self._heard:
            # Real time starts no earlier than a beat before the session's first beat ended: a
            # start that came beats after the first frame (`opened` answered before the copy
            # that starts it) would otherwise have those beats' frames sent ahead, a standing
            # excess the clock's jitter buffer sheds.
            self._heard = True
            if self._t0 is not None:
                self._t0 = max(self._t0, self.clock.now() - BEAT_S)
        self._release()
        h = msg.header
        pcm = msg.pcm
        self._out_frame = max(self._out_frame, h["frame"] + pcm.shape[0])
        for f in range(pcm.shape[0]):
            self._output.frame(h["frame"] + f, pcm[f], h["text"][f], h["user"][f], h["func"][f])

    def _tool_result(self, ids: list[int]) -> None:
        """Tool-result tokens to the model (one a frame), unless that would leave more than
        TOOL_BACKLOG of them waiting: then refused, told and counted (a client sending results
        faster than they are heard would otherwise grow the node's memory without bound)."""
        waiting = max(0, self._tool_heard_by - self._out_frame)
        if waiting + len(ids) > TOOL_BACKLOG:
            self.counters.tool_refused += 1
            self._error(P.OVERLOADED, f"function_result refused: {waiting} tool tokens are still "
                        f"to be heard, one a frame (at most {TOOL_BACKLOG} may wait)")
            return
        self._tool_heard_by = max(self._tool_heard_by, self._out_frame) + len(ids)
        self._on_function_tokens(self, ids)

    def _error(self, code: str, message: str) -> None:
        self._send(P.error_frames(code, message, self.cfg.session))

    def _engine_lost(self) -> None:
        self.counters.engine_unavailable += 1

    def end_stream(self) -> bool:
        """Mark the end of this session's frames to the clock, after them in the same batches:
        the clock counts every frame sent before it (heard or dropped) before it frees the slot.
        False when the marker could not be sent (the clock is restarting)."""
        batcher = self._frames()
        return batcher is not None and batcher.end_stream(*self._handle)

    def take_queued_audio(self) -> None:
        """At close: audio messages the front queued before the close was handled are taken
        now, so their frames reach the clock before its end-of-stream marker (or are counted)."""
        for env in self.mailbox.drain():
            if isinstance(env.msg, AudioIn):
                self._on_audio(env.msg)

    def flush_input(self) -> None:
        """At close: audio still inside the resampler, short of a whole frame, or held for a
        missing seq will never be heard. Counted in samples at the client's rate."""
        if self._in_resampler._stream is not None:
            tail = self._in_resampler(np.zeros(0, np.float32), last=True)
            self._pending = np.concatenate([self._pending, tail])
        c = self.counters
        c.dropped_samples += round(len(self._pending) * self.cfg.sample_rate / IN_RATE)
        self._pending = np.zeros(0, np.float32)
        c.dropped_samples += round(len(self._held) * self.cfg.frame_samples)
        self._held.clear()
        c.dropped_samples += sum(len(p) // self._bps for p in self._reorder.take_held())

    def input_drops(self) -> int:
        """Input frames lost on this side of the clock: dropped samples as whole 80 ms frames
        (a started frame counts as one), and frames the clock could not take."""
        c = self.counters
        return -(-c.dropped_samples * IN_RATE // (self.cfg.sample_rate * SAMPLES_IN)) \
            + c.engine_unavailable
