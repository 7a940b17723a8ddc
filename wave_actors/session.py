"""SessionActor: one per live conversation, between its client and the beat clock.

Inbound: reorder `audio` by `seq` within a small window, decode the wire format, resample once to
16 kHz (a streaming soxr resampler), cut 80 ms frames and send each, numbered and
naming the session's handle, to the clock over ZMQ (inproc). Outbound: the clock puts each beat's outputs in this actor's mailbox; its two frames are resampled to the session's rate,
encoded and sent as `audio`; text and user-transcript tokens are decoded incrementally into
`text` deltas; function-channel tokens are parsed into `function_call`s.

Every input is accounted for: frames reach the clock, or are counted (`dropped_in` with a reason:
duplicate or stale seq, seq gap, bad payload, mailbox overflow).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import numpy as np
import zmq
import zmq.asyncio

from transports import audio as A
from transports import protocol as P
from transports import zsock
from wave_actors.core.contract import NO_TOKEN, Handle, TextCodec
from wave_actors.core.frames import IN_RATE, OUT_RATE, SAMPLES_IN
from wave_actors.core.function_calls import FunctionCallParser, result_tokens
from wave_actors.core.session_table import END_OF_STREAM, FRAME_HEADER
from wave_actors.core.text import TextStream
from wave_actors.core.timebase import Clock
from wave_actors.runtime import Actor

log = logging.getLogger("wave.session")

REORDER_WINDOW = 8          # messages held while waiting for a missing seq


@dataclass
class AudioIn:
    seq: int
    payload: bytes


@dataclass
class FunctionResult:
    call_id: str
    output: str


@dataclass
class Close:
    reason: str = "client"          # client | lost | drain | crash


@dataclass
class BeatOut:
    header: dict
    pcm: np.ndarray          # [frames, SAMPLES_OUT] float32, a row of the beat's output copy


@dataclass
class SessionCounters:
    messages_in: int = 0
    reordered: int = 0
    duplicates: int = 0
    seq_gaps: int = 0               # seqs never received (skipped past the window)
    bad_payloads: int = 0
    dropped_in_mailbox: int = 0     # audio messages the mailbox dropped under overload
    dropped_out: int = 0            # output frames the client could not take
    frames_sent: int = 0
    engine_unavailable: int = 0     # frames the clock could not take (it was restarting)
    unheard_at_close: int = 0       # partial frames and held messages when the session closed


@dataclass
class SessionConfig:
    session: str
    identity: bytes
    handle: Handle                  # the session in the clock's table
    sample_rate: int
    format: str
    output_sample_rate: int
    output_format: str
    clock_endpoint: str
    idle_timeout_s: float = 10.0


class SessionActor(Actor):
    audio_cap = 256

    def __init__(self, cfg: SessionConfig, ctx: zmq.asyncio.Context,
                 send_client: Callable[..., bool],
                 text_codec: TextCodec, user_codec: TextCodec, clock: Clock,
                 on_close: Callable[["SessionActor", Close], Any],
                 last_seen: Callable[[bytes], float],
                 on_function_tokens: Callable[["SessionActor", list[int]], None],
                 output_turn: Callable[[], Awaitable[None]] | None = None):
        super().__init__(f"session:{cfg.session}")
        self.cfg, self.ctx, self.clock = cfg, ctx, clock
        self._send_client, self._on_close, self._last_seen = send_client, on_close, last_seen
        self._on_function_tokens = on_function_tokens
        self._handle = (cfg.handle.slot, cfg.handle.generation)
        self._output_turn = output_turn     # the clock's BeatClockActor.output_turn
        self._text_codec = text_codec
        self.counters = SessionCounters()
        self.mailbox.on_drop = self._count_mailbox_drop
        self._expected_seq = 0
        self._held: dict[int, bytes] = {}
        self._in_resampler = A.StreamResampler(cfg.sample_rate, IN_RATE)
        self._out_resampler = A.StreamResampler(OUT_RATE, cfg.output_sample_rate)
        self._pending = np.zeros(0, np.float32)
        self._frame_no = 0
        self._out_seq = 0
        self._out_pending = np.zeros(0, np.float32)
        self._out_frame_len = cfg.output_sample_rate * 80 // 1000
        self._agent_text = TextStream(text_codec)
        self._user_text = TextStream(user_codec)
        self._calls = FunctionCallParser(text_codec, cfg.session)
        self._bps = P.BYTES_PER_SAMPLE[cfg.format]
        self._last_input = 0.0
        self._sock: zmq.asyncio.Socket | None = None
        self._watchdog: asyncio.Task | None = None
        self.closing = False

    def _count_mailbox_drop(self, msg: Any) -> None:
        self.counters.dropped_in_mailbox += 1

    # -- lifecycle --------------------------------------------------------------------------------
    async def on_start(self) -> None:
        self._sock = self.ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(self.cfg.clock_endpoint)
        self._tx = zsock.Tx(self._sock)
        self._last_input = self.clock.now()
        loop = asyncio.get_running_loop()
        self._watchdog = loop.create_task(self._watch_idle())

    async def on_stop(self) -> None:
        if self._watchdog:
            self._watchdog.cancel()
        if self._sock is not None:
            self._sock.close(0)

    async def _watch_idle(self) -> None:
        """A client that vanished without `close`: no input and no ping for `idle_timeout_s`."""
        while True:
            await self.clock.sleep(min(1.0, self.cfg.idle_timeout_s / 4))
            last = max(self._last_input, self._last_seen(self.cfg.identity))
            if self.clock.now() - last > self.cfg.idle_timeout_s and not self.closing:
                self.tell(Close("lost"))
                return

    # -- messages ---------------------------------------------------------------------------------
    async def handle(self, msg: Any) -> Any:
        if isinstance(msg, AudioIn):
            self._on_audio(msg)
        elif isinstance(msg, BeatOut):
            if self._output_turn is not None:    # not across a release: the beat goes first
                await self._output_turn()
            self._on_beat(msg)
        elif isinstance(msg, FunctionResult):
            self._on_function_tokens(self, result_tokens(self._text_codec, msg.output))
        elif isinstance(msg, Close):
            await self._on_close(self, msg)
        else:
            raise TypeError(f"unexpected message {type(msg).__name__}")

    def _on_audio(self, msg: AudioIn) -> None:
        self.counters.messages_in += 1
        self._last_input = self.clock.now()
        if msg.seq < self._expected_seq or msg.seq in self._held:
            self.counters.duplicates += 1
            self._error(P.BAD_SEQ, f"seq {msg.seq} is a duplicate or arrived after its turn "
                                   f"(expected {self._expected_seq}); dropped")
            return
        if msg.seq > self._expected_seq:
            self.counters.reordered += 1
            self._held[msg.seq] = msg.payload
            if len(self._held) <= REORDER_WINDOW:
                return
            # The window is full: give up on the missing seqs and move on.
            first = min(self._held)
            self.counters.seq_gaps += first - self._expected_seq
            self._expected_seq = first
        else:
            self._held[msg.seq] = msg.payload
        while self._expected_seq in self._held:
            self._ingest(self._held.pop(self._expected_seq))
            self._expected_seq += 1

    def _ingest(self, payload: bytes) -> None:
        if len(payload) % self._bps:
            self.counters.bad_payloads += 1
            self._error(P.BAD_PAYLOAD, f"audio payload of {len(payload)} bytes is not a whole "
                                       f"number of {self.cfg.format} samples; dropped")
            return
        x = self._in_resampler(A.decode(payload, self.cfg.format))
        pending = np.concatenate([self._pending, x]) if len(self._pending) else x
        n = len(pending) // SAMPLES_IN
        for i in range(n):
            frame = pending[i * SAMPLES_IN:(i + 1) * SAMPLES_IN]
            try:
                self._tx.send([FRAME_HEADER.pack(*self._handle, self._frame_no), frame.tobytes()])
            except zmq.ZMQError:
                self.counters.engine_unavailable += 1     # the clock is restarting
            self._frame_no += 1
        self._pending = pending[n * SAMPLES_IN:].copy()

    def _on_beat(self, msg: BeatOut) -> None:
        h = msg.header
        pcm = msg.pcm
        for f in range(pcm.shape[0]):
            frame = h["frame"] + f
            self._send_audio(frame, self._out_resampler(pcm[f]))
            self._emit_text(frame, h["text"][f], h["user"][f])
            for call in self._calls.push(h["func"][f]):
                self._send_client(self.cfg.identity, P.pack(
                    "function_call", self.cfg.session, call_id=call.call_id, name=call.name,
                    arguments=call.arguments))
            for problem in self._calls.take_errors():
                self._error("bad_function_call", problem)

    def _send_audio(self, frame: int, x: np.ndarray) -> None:
        """Exactly one 80 ms frame per `audio` message at the output rate: a resampler's chunks
        vary in length, so its output is re-cut (the first frame waits out its latency)."""
        self._out_pending = np.concatenate([self._out_pending, x]) if len(self._out_pending) else x
        while len(self._out_pending) >= self._out_frame_len:
            chunk = self._out_pending[:self._out_frame_len]
            self._out_pending = self._out_pending[self._out_frame_len:]
            ok = self._send_client(self.cfg.identity, P.pack(
                "audio", self.cfg.session, A.encode(chunk, self.cfg.output_format),
                seq=self._out_seq, frame=frame), True)
            self._out_seq += 1
            if ok:
                self.counters.frames_sent += 1
            else:
                self.counters.dropped_out += 1

    def _emit_text(self, frame: int, text_token: int, user_tokens: list[int]) -> None:
        agent = self._agent_text.push([text_token])
        if agent:
            self._send_client(self.cfg.identity, P.pack(
                "text", self.cfg.session, channel="agent", frame=frame, text=agent))
        user = self._user_text.push([t for t in user_tokens if t != NO_TOKEN])
        if user:
            self._send_client(self.cfg.identity, P.pack(
                "text", self.cfg.session, channel="user", frame=frame, text=user))

    def _error(self, code: str, message: str) -> None:
        self._send_client(self.cfg.identity, P.error_frames(code, message, self.cfg.session))

    def end_stream(self) -> bool:
        """Mark the end of this session's frames on its socket to the clock: the clock counts
        every frame sent before it (heard or dropped) before it frees the slot. False when the
        marker could not be sent (the clock is restarting)."""
        if self._sock is None:
            return False
        try:
            self._tx.send([FRAME_HEADER.pack(*self._handle, END_OF_STREAM), b""])
        except zmq.ZMQError:
            return False
        return True

    def flush_input(self) -> None:
        """At close: audio still inside the resampler or short of a whole frame will never be
        heard. Count it (a started frame counts as one) instead of letting it vanish."""
        if self._in_resampler._stream is not None:
            tail = self._in_resampler(np.zeros(0, np.float32), last=True)
            self._pending = np.concatenate([self._pending, tail])
        self.counters.unheard_at_close += -(-len(self._pending) // SAMPLES_IN)
        self._pending = np.zeros(0, np.float32)
        held = sum(len(p) // self._bps for p in self._held.values())   # waiting for a missing seq
        self.counters.unheard_at_close += -(-held * IN_RATE // (self.cfg.sample_rate * SAMPLES_IN))
        self._held.clear()

    def input_drops(self) -> int:
        c = self.counters
        return (c.duplicates + c.bad_payloads + c.dropped_in_mailbox + c.seq_gaps
                + c.engine_unavailable + c.unheard_at_close)
