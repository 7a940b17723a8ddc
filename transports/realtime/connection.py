"""One Realtime WebSocket connection and its node session (see `server.py` for the bridge).

Per connection four tasks: the reader parses client events and runs each one's handler
(`client_events.py`): audio is queued in the input feed (`feed.py`: bounded, a refused append
told and counted), function results are forwarded to the node; the feeder sends the feed's
audio to the node at the model's pace, and silence while the client sends none (a connected
client is a live call: no idle close); the pump turns node events into server events
(`Conversation`) and queues them in a bounded `Outbox`; the writer sends from the outbox. A
client that stops reading fills the outbox: audio deltas are then dropped and counted, and
after `stall_grace_s` of dropping (or once the non-droppable events overflow) the connection
is aborted.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import socket

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from transports import client as C
from transports.realtime.client_events import HANDLERS
from transports.realtime.codec import MAX_AUDIO_MESSAGE_BYTES, Converter
from transports.realtime.conversation import AUDIO_DELTA_TYPES, Conversation, Ids
from transports.realtime.dialect import Dialect, DialectError, dialect_of
from transports.realtime.feed import InputFeed
from transports.realtime.outbox import Outbox, Overflow
from transports.realtime.session import (FORMAT_NAMES, NATIVE_INPUT, NATIVE_OUTPUT,
                                         VLLM_OMNI_CAPABILITIES, AudioSpec, EventError,
                                         SessionConfig, parse_event, session_object)
from transports.realtime.views import BridgeView
from wave_actors.core.frames import OUT_RATE
from wave_actors.core.tasks import stop_tasks, within


log = logging.getLogger("wave.realtime")
CLOSED_AFTER_UNKNOWN_S = 2.0    # after `unknown_session`, how long a `closed` may still come


class _Stop(Exception):
    """The connection is closing; the reader stops."""


class Connection:
    def __init__(self, bridge: BridgeView, ws: ServerConnection):
        self.bridge, self.ws, self.cfg = bridge, ws, bridge.cfg
        self.ids = Ids()
        self.node_id = f"rt-{self.ids.prefix}-{os.urandom(4).hex()}"
        self.dialect_error: str | None = None
        try:
            self.dialect = dialect_of(ws.request.path, ws.request.headers)
        except DialectError as exc:          # told in `run`, before anything else
            self.dialect, self.dialect_error = Dialect(), str(exc)
        self.conv = Conversation(self.dialect.beta, self.ids, self.cfg.turn_gap_frames,
                                 vllm_omni=self.dialect.vllm_omni)
        # vllm-omni's clients take the model's own rate (22.05 kHz pcm16: 3528 bytes a frame)
        self.session = SessionConfig(output=NATIVE_OUTPUT) if self.dialect.vllm_omni \
            else SessionConfig()
        self.closed_sent = False                     # the client was told the session ended
        self.node: C.ClientSession | None = None
        self.to_node: Converter | None = None       # client input -> 16 kHz f32
        self.from_node: Converter | None = None     # node output -> client output format
        self.node_out = NATIVE_OUTPUT
        self.outbox = Outbox(self.cfg.outbox_bytes, self.cfg.outbox_hard_bytes)
        self.abort_reason: str | None = None
        self.audio_bytes_to_node = 0                # converted input sent, all pieces
        self.feed = InputFeed(self.cfg.feed, NATIVE_INPUT.rate * NATIVE_INPUT.bytes_per_sample,
                              NATIVE_INPUT.bytes_per_sample, MAX_AUDIO_MESSAGE_BYTES)
        self.node_stats: dict | None = None         # the node's `closed` stats, once it sent them
        self._tasks: list[asyncio.Task] = []
        self._feeder: asyncio.Task | None = None
        self._writer: asyncio.Task | None = None
        self.parked = False                 # its socket dropped; it waits to be resumed
        self._closing = False               # the bridge is ending it: not resumable
        self._grace: asyncio.Task | None = None

    # ---- lifecycle ------------------------------------------------------------------------

    async def run(self, ws: ServerConnection) -> None:
        """Serves `ws` until it closes: the connection's first socket, or (vllm-omni) a later
        one resuming its parked session."""
        resuming = self.parked
        self._attach(ws)
        try:
            if self.dialect_error:
                self.emit(self.conv.error("invalid_dialect", self.dialect_error))
                await self.close(1008, "invalid dialect")
            sid = self.dialect.session_id if self.dialect.vllm_omni else None
            if sid is not None and not resuming:
                if sid in self.bridge.named:
                    self.emit(self.conv.error("session_id_in_use", f"session {sid!r} is live "
                                              "on another connection"))
                    await self.close(1008, "session_id in use")
                self.bridge.named[sid] = self
            self.emit(self.conv.event("session.created", session=self.session_obj(),
                                      **({"resumed": True} if resuming else {})))
            if self.dialect.vllm_omni and self.dialect.autostart:
                await self.open_node()          # its default session, before any event
            async for message in self.ws:
                await self._on_message(message)
        except (ConnectionClosed, _Stop):
            pass
        finally:
            if self._resumable():
                await self._park()
            else:
                await self._shutdown()

    def _attach(self, ws: ServerConnection) -> None:
        if self._grace is not None:
            self._grace.cancel()
        if self.parked:
            log.info("%s resumed (session %s)", self.node_id, self.dialect.session_id)
        self.ws, self.parked = ws, False
        self.outbox = Outbox(self.cfg.outbox_bytes, self.cfg.outbox_hard_bytes)
        self.abort_reason = None
        sock = ws.transport.get_extra_info("socket")
        if sock is not None and self.cfg.sndbuf_bytes:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.cfg.sndbuf_bytes)
        self._writer = asyncio.create_task(self._write_loop())
        self._tasks.append(self._writer)

    def _resumable(self) -> bool:
        """A vllm-omni session with an id whose socket dropped (not closed by either side on
        purpose) waits to be resumed."""
        return (self.dialect.vllm_omni and self.dialect.session_id is not None
                and self.bridge.named.get(self.dialect.session_id) is self
                and not self._closing and not self.closed_sent
                and self.node is not None and self.node.closed is None)

    async def _park(self) -> None:
        """Keep the session (the model goes on hearing silence) for `resume_grace_s`; what it
        says meanwhile is not kept (counted)."""
        await stop_tasks([self._writer])
        self._tasks.remove(self._writer)
        self.bridge.totals["dropped_deltas"] += self.outbox.dropped
        self.parked = True
        log.info("%s: socket dropped; session %s kept %g s for a resume", self.node_id,
                 self.dialect.session_id, self.cfg.resume_grace_s)
        self._grace = asyncio.create_task(self._expire(self.cfg.resume_grace_s))

    async def _expire(self, after_s: float) -> None:
        await asyncio.sleep(after_s)
        if self.parked:
            log.info("%s: not resumed in %g s; closing", self.node_id, self.cfg.resume_grace_s)
            self.parked = False
            await self._shutdown()          # then gone from the bridge: its session is closed
            self.bridge.connections.discard(self)
            if self.bridge.named.get(self.dialect.session_id) is self:
                del self.bridge.named[self.dialect.session_id]

    async def _shutdown(self) -> None:
        self.bridge.totals["dropped_deltas"] += self.outbox.dropped
        await stop_tasks(self._tasks)
        if self.node is not None and self.node.closed is None:
            try:
                self.node_stats = (await within(self.node.close(timeout=2.0), 2.0)).stats
            except (asyncio.TimeoutError, OSError, C.NodeUnavailable):
                log.warning("%s: node did not confirm close", self.node_id)
        elif self.node is not None:
            self.node_stats = self.node.closed.stats
        if self.feed.queued:
            self.bridge.totals["input_unheard_bytes"] += self.feed.queued
            log.info("%s: %.2f s of input still queued at close, never heard", self.node_id,
                     self.feed.seconds(self.feed.queued))
        ob = self.outbox
        log.info("%s closed: %d audio deltas (%d bytes) dropped for a slow reader, queue high "
                 "water %d bytes, %d frames muted%s; node stats %s", self.node_id, ob.dropped,
                 ob.dropped_bytes, ob.high_water, self.conv.muted_frames,
                 f", aborted: {self.abort_reason}" if self.abort_reason else "", self.node_stats)

    async def close(self, code: int, reason: str) -> None:
        """Close from the reader: flush, close, and stop reading."""
        self._closing = True
        await self._flush_and_close(code, reason)
        raise _Stop

    async def _flush_and_close(self, code: int, reason: str) -> None:
        """Let queued events (an error explaining why) go out for up to 1 s, then close."""
        self._closing = True
        if self.parked:                    # nobody to tell: end it now, not at the grace's end
            self._grace.cancel()
            self._grace = asyncio.create_task(self._expire(0.0))
            return
        for _ in range(50):
            if not self.outbox:
                break
            await asyncio.sleep(0.02)
        await self.ws.close(code, reason[:120])

    def _abort(self, reason: str) -> None:
        """A reader that stopped reading cannot be sent a close frame: drop the TCP connection."""
        if self.abort_reason is None:
            self.abort_reason = reason
            self.bridge.totals["aborted_slow"] += 1
            log.warning("%s: aborting connection: %s", self.node_id, reason)
            self.ws.transport.abort()

    # ---- outgoing -------------------------------------------------------------------------

    def emit(self, events: list[dict]) -> None:
        if self.parked:                    # no socket: the client misses these
            self.bridge.totals["parked_events_dropped"] += len(events)
            return
        for ev in events:
            droppable = ev["type"] in AUDIO_DELTA_TYPES
            try:
                sent = self.outbox.put(json.dumps(ev, separators=(",", ":")), droppable)
            except Overflow as exc:
                return self._abort(str(exc))
            if not sent and self.outbox.dropped == 1:
                log.warning("%s: client is not reading; dropping audio deltas", self.node_id)
            if not sent and self.outbox.stalled_for() > self.cfg.stall_grace_s:
                return self._abort(f"client read nothing for {self.cfg.stall_grace_s:.1f} s; "
                                   f"{self.outbox.dropped} audio deltas dropped")

    async def _write_loop(self) -> None:
        try:
            while True:
                await self.ws.send(await self.outbox.get())
        except ConnectionClosed:
            pass

    def session_obj(self) -> dict:
        if self.dialect.vllm_omni:
            return session_object(self.session, self.dialect.session_id or self.node_id, True,
                                  VLLM_OMNI_CAPABILITIES)
        return session_object(self.session, self.node_id, self.conv.beta)

    # ---- incoming -------------------------------------------------------------------------

    async def _on_message(self, message: str | bytes) -> None:
        event_id = None
        try:
            event = parse_event(message, self.cfg.max_event_bytes)
            event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
            handler = HANDLERS.get(event["type"])
            if handler is None:
                raise EventError("unknown_event_type", f"unknown event type {event['type']!r}; "
                                 f"this server takes {sorted(HANDLERS)}", "type")
            await handler(self, event)
        except EventError as exc:
            self.emit(self.conv.error(exc.code, exc.message, event_id, exc.param, exc.kind))
        except (ConnectionClosed, _Stop, asyncio.CancelledError):
            raise
        except Exception:                  # a bug here must not take the connection down
            log.exception("%s: failed on a client event", self.node_id)
            self.emit(self.conv.error("internal", "the bridge failed on this event; it was "
                                      "logged", event_id, kind="server_error"))

    # ---- the node -------------------------------------------------------------------------

    async def open_node(self) -> None:
        if self.node is not None:
            return
        cfg, out = self.session, NATIVE_OUTPUT if self.session.output == NATIVE_OUTPUT else \
            AudioSpec("pcm_f32le", OUT_RATE)
        try:
            # wait_for bounds the send too: a DEALER with no peer (node down, CURVE refused)
            # blocks on send, and NodeClient.open's own timeout covers only the reply.
            self.node = await within(self.bridge.client.open(
                self.node_id, sample_rate=NATIVE_INPUT.rate, format=NATIVE_INPUT.fmt,
                output_sample_rate=out.rate, output_format=out.fmt,
                instructions=cfg.instructions, tools=list(cfg.tools),
                timeout=self.cfg.open_timeout_s), self.cfg.open_timeout_s)
        except C.Refused as exc:
            if exc.reason == "invalid":
                raise EventError("session_invalid", f"the node refused the session: {exc.message}",
                                 kind="invalid_request_error")
            self.emit(self.conv.error(f"session_refused_{exc.reason}", f"the node refused the "
                                      f"session ({exc.reason}): {exc.message}",
                                      kind="server_error"))
            retryable = exc.reason in ("capacity", "admission", "draining")
            await self.close(1013 if retryable else 1008, exc.reason)
        except asyncio.TimeoutError:
            self.emit(self.conv.error("node_unavailable", "the model node did not answer in "
                                      f"{self.cfg.open_timeout_s:g} s", kind="server_error"))
            await self.close(1011, "node unavailable")
        self.node_out = out
        self.set_converters()
        self._tasks.append(asyncio.create_task(self._pump()))
        self._feeder = asyncio.create_task(self._feed_loop())
        self._tasks.append(self._feeder)

    def set_converters(self, input: bool = True, output: bool = True) -> None:
        if input:
            self.to_node = Converter(self.session.input, NATIVE_INPUT)
        if output:
            self.from_node = Converter(self.node_out, self.session.output)
            if self.dialect.vllm_omni:
                out = self.session.output
                self.conv.audio_fields = {"format": FORMAT_NAMES[out.fmt],
                                          "sample_rate_hz": out.rate}

    async def send_input(self, pieces) -> None:
        """Converted input into the feed's queue (`_feed_loop` sends it at the model's pace);
        an append that does not fit is refused, told and counted."""
        pieces = list(pieces)
        refused = 0
        if not self.feed.push(pieces, asyncio.get_running_loop().time()):
            refused = sum(map(len, pieces))
        if refused:
            self.bridge.totals["input_refused_bytes"] += refused
            f = self.feed
            self.emit(self.conv.error(
                "input_audio_buffer_full", f"{f.seconds(refused):.2f} s of this append refused: "
                f"{f.seconds(f.queued):.1f} s of input are queued, not yet heard (at most "
                f"{self.cfg.feed.capacity_s:g} s); the model hears input in real time"))

    def stop_feed(self) -> None:
        if self._feeder is not None:
            self._feeder.cancel()

    async def _feed_loop(self) -> None:
        """The feed's due audio (and silence while the client sends none) to the node, one
        `audio` message each, counted."""
        loop, totals = asyncio.get_running_loop(), self.bridge.totals
        silence = self.feed.silence_bytes
        while True:
            due = self.feed.take_pieces(loop.time())
            try:
                while due:
                    pcm = due[0][0]
                    await self.send_to_node(self.node.send_audio(pcm))
                    due.pop(0)
                    self.audio_bytes_to_node += len(pcm)
                    totals["audio_messages"] += 1
                    totals["audio_bytes"] += len(pcm)
                    totals["largest_audio_message"] = max(totals["largest_audio_message"],
                                                          len(pcm))
            finally:                # stopped midway (a close): what was not sent is still queued
                self.feed.requeue(due)
            totals["silence_bytes"] += self.feed.silence_bytes - silence
            silence = self.feed.silence_bytes
            await asyncio.sleep(self.cfg.feed.tick_s)

    async def send_to_node(self, send) -> None:
        try:
            await within(send, self.cfg.node_send_timeout_s)
        except asyncio.TimeoutError:
            self.emit(self.conv.error("node_unavailable", "the model node stopped taking input",
                                      kind="server_error"))
            await self.close(1011, "node unavailable")

    async def _pump(self) -> None:
        """Node events -> server events, until the node closes the session."""
        node, conv = self.node, self.conv
        lost: C.Error | None = None
        while True:
            try:
                ev = await (node.next_event() if lost is None else
                            within(node.next_event(), CLOSED_AFTER_UNKNOWN_S))
            except asyncio.TimeoutError:
                self.emit(conv.error(lost.code, f"node: {lost.message}", kind="server_error"))
                self.tell_closed(None, "lost by the node")
                return await self._flush_and_close(1011, "the node lost the session")
            if isinstance(ev, C.Audio):
                self.emit(conv.audio(ev.frame, self.from_node(ev.payload)))
            elif isinstance(ev, C.Text):
                if ev.channel == "user":
                    self.emit(conv.user_text(ev.frame, ev.text))
                else:
                    self.emit(conv.agent_text(ev.frame, ev.text))
            elif isinstance(ev, C.FunctionCall):
                self.emit(conv.function_call(ev.call_id, ev.name, ev.arguments))
            elif isinstance(ev, C.Error) and ev.code == "unknown_session":
                # The node ending the session (a drain) answers input sent meanwhile with this
                # before its `closed`; a node that lost it (a restart) sends no `closed`.
                lost = lost or ev
                self.stop_feed()
            elif isinstance(ev, C.Error):
                self.emit(conv.error(ev.code, f"node: {ev.message}", kind="server_error"))
            elif isinstance(ev, C.Closed):
                self.tell_closed(ev.stats, "closed by the node")
                return await self._flush_and_close(1000, "session closed by the node")

    def tell_closed(self, stats: dict | None, reason: str) -> None:
        """The session's end, told once: what is open finished, and (a dialect that has it:
        not an OpenAI event) `session.closed`."""
        if self.closed_sent:
            return
        self.closed_sent = True
        closed = self.conv.event("session.closed", session_id=self.dialect.session_id or
                                 self.node_id, reason=reason, stats=stats or {}) \
            if self.dialect.vllm_omni else []
        self.emit(self.conv.closed() + closed)
