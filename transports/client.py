"""An asyncio client of the node's wire protocol: one DEALER socket carrying many sessions.

Every bridge, the WAV client and the benchmark use it. Node messages are parsed with the same
schema module as the node's and dispatched to a bounded event queue per session.

Liveness (docs/PROTOCOL.md): the client pings the node every heartbeat (and each session that
sent nothing in that time, so a quiet session is not taken as idle). A dropped connection comes
back by itself (ZeroMQ reconnects). One that hears nothing from the node for SILENT_BEATS
heartbeats is taken for gone (half-open, or a reconnect the node did not attach because it
still holds our old connection under the same identity), and the client redials under a fresh
random identity. When the connection is back,
or the node says a session is detached, it sends `resume` with the session's token; on `resumed`
it sends again the audio the node did not get, from a replay buffer of recent messages. The
application sees none of this beyond `ClientSession.resumes`.

    async with NodeClient("tcp://127.0.0.1:5555") as client:
        s = await client.open("call-1", sample_rate=16000, format="pcm_f32le")
        await s.send_audio(pcm_bytes)
        ev = await s.next_event()          # Audio / Text / FunctionCall / Closed / Error
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import os
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from transports import protocol as P
from transports import zsock
from transports.client_events import (Audio, Closed, Error, FunctionCall, NodeUnavailable,
                                       Refused, Text, event_of)
from transports.client_session import ClientSession
from wave_actors.core.tasks import stop_tasks, within

# A session's events and the client's exceptions live in client_events.py, the session in
# client_session.py; named here too, as every caller imports them from the client.
__all__ = ["Audio", "Closed", "ClientSession", "CurveKeys", "Error", "FunctionCall", "NodeClient",
           "NodeUnavailable", "Refused", "Text"]

SEND_TIMEOUT_S = 10.0       # how long a send may wait for a node to take it
HEARTBEAT_S = 1.0           # until a node's `opened` says otherwise
SILENT_BEATS = 3            # heartbeats without a word from the node: the connection is gone
_MONITORS = itertools.count()


def fresh_identity() -> bytes:
    """A routing identity no other peer can guess (128 random bits): the node never attaches
    a connection under an identity that another live connection holds."""
    return b"c-" + os.urandom(16).hex().encode()


@dataclass
class CurveKeys:
    """Client CURVE keys (z85 bytes) and the node's public key."""
    public: bytes
    secret: bytes
    server_public: bytes


class NodeClient:
    def __init__(self, endpoint: str, identity: bytes | None = None,
                 curve: CurveKeys | None = None, ctx: zmq.asyncio.Context | None = None):
        self.endpoint = endpoint
        self.identity = identity or fresh_identity()     # the first connection's; see _redial
        self.ctx = ctx or zmq.asyncio.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, self.identity)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 100_000)      # many sessions share this socket
        self._tx = zsock.Tx(self.sock)                # cheap sends and drained receives
        if curve is not None:
            self.sock.curve_publickey = curve.public
            self.sock.curve_secretkey = curve.secret
            self.sock.curve_serverkey = curve.server_public
        self.sessions: dict[str, ClientSession] = {}
        self._pending_open: dict[str, asyncio.Future] = {}
        self._pongs: dict[Any, asyncio.Future] = {}
        # errors about no session, or about unknown ones; bounded: a chatty node cannot grow us
        self.orphan_errors: collections.deque[Error] = collections.deque(maxlen=256)
        self._reader: asyncio.Task | None = None
        self._pinger: asyncio.Task | None = None
        self._period_changed = asyncio.Event()   # a session opened: the node's heartbeat applies
        self._handshakes = 0
        self._last_heard = 0.0                  # when the node last said anything (loop time)
        self._resume_queued = False             # a redial queued its sessions' `resume`s
        self._monitor: asyncio.Task | None = None
        self._monitor_sock: zmq.Socket | None = None
        # every send begun and not done, in the order begun: each waits for those before it,
        # so messages leave in the order they were asked, whatever waits for room
        self._line: collections.deque[asyncio.Future] = collections.deque()
        self.auth_failed = False
        self._curve = curve is not None

    async def __aenter__(self) -> "NodeClient":
        self.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def connect(self) -> None:
        loop = asyncio.get_running_loop()
        # Attached before connecting: a refusal of the first handshake is not missed.
        # A unique address: pyzmq names it after the socket's fd by default, which a later
        # socket reuses while the closed one's monitor may still be bound there.
        mon = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                           | zmq.EVENT_HANDSHAKE_SUCCEEDED,
                                           addr=f"inproc://wave-client-monitor-{next(_MONITORS)}")
        self._monitor_sock = mon
        self._monitor = loop.create_task(self._watch_handshakes(mon))
        self.sock.connect(self.endpoint)
        self._reader = loop.create_task(self._read_loop())
        self._pinger = loop.create_task(self._heartbeats())

    def lose(self, sid: str, code: str, message: str) -> bool:
        """End a session here without its node (the node is gone): its application reads an
        `error` of `code`, then `closed` with that reason. False: no such live session."""
        session = self.sessions.pop(sid, None)
        if session is None or session.closed is not None:
            return False
        session.deliver(Error(code, message))
        session.deliver(Closed({"reason": code}))
        return True

    async def aclose(self) -> None:
        # The monitor stops before its reader closes: libzmq's I/O thread sends events on a
        # blocking pair socket, and one for a reader gone (a handshake finishing as we close)
        # would stall that thread, and every socket of the context, for good.
        if not self.sock.closed:
            self.sock.disable_monitor()
        await stop_tasks([self._reader, self._monitor, self._pinger])
        if self._monitor_sock is not None:
            self._monitor_sock.close(0)
        self._tx.close(0)

    async def send(self, frames: list[bytes], timeout: float | None = SEND_TIMEOUT_S) -> None:
        """Send one message. A DEALER with no connected node blocks; past `timeout` this raises
        `NodeUnavailable` (with `unauthorized` when the node refused our CURVE key)."""
        await self._sent_in_turn(self._take_turn(), frames, timeout)

    def send_soon(self, frames: list[bytes]) -> None:
        """A send from a callback: now if the socket has room and no send waits for it, else
        from a task, its place in line taken now (never ahead of a send begun before it: a
        `resume` or `close` must not pass the audio it follows; never behind one begun after)."""
        if not self._line:
            try:
                self._tx.send(frames)
                return
            except zmq.Again:
                pass
            except zmq.ZMQError:
                return                            # closed: nothing more to say
        task = asyncio.get_running_loop().create_task(self._send_quietly(self._take_turn(),
                                                                          frames))
        task.add_done_callback(lambda t: t.exception())

    async def _send_quietly(self, turn: asyncio.Future, frames: list[bytes]) -> None:
        try:
            await self._sent_in_turn(turn, frames, SEND_TIMEOUT_S)
        except (NodeUnavailable, zmq.ZMQError):
            pass

    def _take_turn(self) -> asyncio.Future:
        """A place at the end of the line: done once every send before it is."""
        turn = asyncio.get_running_loop().create_future()
        self._line.append(turn)
        if len(self._line) == 1:
            turn.set_result(None)
        return turn

    def _leave(self, turn: asyncio.Future) -> None:
        first = self._line[0] is turn
        self._line.remove(turn)
        if first and self._line and not self._line[0].done():
            self._line[0].set_result(None)

    async def _sent_in_turn(self, turn: asyncio.Future, frames: list[bytes],
                            timeout: float | None) -> None:
        try:
            await turn
            try:                                   # the usual case: the queue has room now
                self._tx.send(frames)
                return
            except zmq.Again:
                pass
            try:
                await within(self._tx.send_waiting(frames), timeout)
            except asyncio.TimeoutError:
                raise NodeUnavailable(self._why_unavailable()) from None
        finally:
            self._leave(turn)

    async def _heartbeats(self) -> None:
        """Paranoid Pirate, client side: something reaches the node every heartbeat while we
        hold sessions, and every session that sent nothing in that time pings in its name. The
        node answers every ping; SILENT_BEATS heartbeats without a word from it mean our
        connection is gone without a sign (half-open, or a reconnect under our identity that
        the node did not attach), and we redial."""
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            period = min((s.opened.get("heartbeat_ms", 1000 * HEARTBEAT_S) / 1000
                          for s in self.sessions.values()), default=HEARTBEAT_S)
            self._period_changed.clear()
            # An open only shortens the wait to the new period from the last heartbeat: a
            # restart on every open would send none while calls open faster than one a period.
            wait = last + period - loop.time()
            if wait > 0:
                try:
                    await within(self._period_changed.wait(), wait)
                    continue
                except asyncio.TimeoutError:
                    pass
            now = last = loop.time()
            if not self.sessions:                   # nothing asked, so silence means nothing
                self._last_heard = now
                continue
            if now - self._last_heard > SILENT_BEATS * period and not self._unread():
                self._last_heard = now
                self._redial()
            self.send_soon(P.pack("ping"))
            for s in list(self.sessions.values()):
                if now - s._last_sent >= period:
                    self.send_soon(P.pack("ping", s.id))

    def _why_unavailable(self) -> str:
        if self.auth_failed:
            return "unauthorized: the node refused this client's CURVE key"
        return f"no node answering at {self.endpoint}"

    async def _watch_handshakes(self, mon: zmq.Socket) -> None:
        """CURVE refusals are silent on the socket itself; the monitor tells them apart from a
        node that is simply not there. Runs until cancelled; `aclose` closes the monitor."""
        from zmq.utils.monitor import recv_monitor_message
        while True:
            ev = await recv_monitor_message(mon)
            if ev["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._handshakes += 1
                if self._handshakes > 1 and not self._resume_queued:
                    for s in list(self.sessions.values()):   # back after a drop: rebind
                        s.ask_resume()
                self._resume_queued = False
            self.auth_failed = ev["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
            if self.auth_failed:
                for fut in self._pending_open.values():
                    if not fut.done():
                        fut.set_exception(Refused("unauthorized", self._why_unavailable()))

    def _unread(self) -> bool:
        """Whether node messages wait to be read: after a stall of this process, the node's
        answers are there before our reader has had its turn."""
        try:
            return bool(self._tx.events() & zsock.POLLIN)
        except zmq.ZMQError:
            return False

    def _redial(self) -> None:
        """The connection is gone without a sign: connect again under a fresh identity (the
        node attaches no connection under an identity it still holds), and our sessions follow
        their tokens. Messages still queued for the old connection go with it (a resume replays
        the audio); an `open` waiting for its answer fails, since its session, if the node made
        one, answers to the old identity."""
        self.identity = fresh_identity()
        self.sock.setsockopt(zmq.IDENTITY, self.identity)
        try:
            self.sock.disconnect(self.endpoint)
        except zmq.ZMQError:
            pass                                # not connected at the moment: nothing to end
        self.sock.connect(self.endpoint)
        self._tx.kick_soon()                    # connecting may consume the socket's edge
        # Each session's `resume` goes first on the new connection: audio queued behind it
        # reaches the node once the session is bound to the new identity.
        self._resume_queued = True
        for session in list(self.sessions.values()):
            session.ask_resume(again=True)
        for fut in self._pending_open.values():
            if not fut.done():
                fut.set_exception(NodeUnavailable("the connection to the node dropped while "
                                                  "opening; open again"))

    async def open(self, session: str, sample_rate: int = 16000, format: str = "pcm_f32le",
                   timeout: float = 10.0, **fields: Any) -> ClientSession:
        """Open a session; raises `Refused` with the node's reason."""
        fut = asyncio.get_running_loop().create_future()
        self._pending_open[session] = fut
        try:
            if self.auth_failed:
                raise Refused("unauthorized", self._why_unavailable())
            # The send blocks while no handshake has completed; a CURVE refusal seen meanwhile
            # (the monitor fails `fut`) ends the wait at once instead of at the timeout.
            sending = asyncio.ensure_future(self.send(
                P.pack("open", session, sample_rate=sample_rate, format=format, **fields),
                timeout))
            try:
                await asyncio.wait({sending, fut}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not sending.done():
                    sending.cancel()
                    await asyncio.gather(sending, return_exceptions=True)
            if not sending.cancelled():
                sending.result()                    # NodeUnavailable past the timeout
            return await within(fut, timeout)
        except asyncio.TimeoutError:
            raise NodeUnavailable(self._why_unavailable()) from None
        finally:
            self._pending_open.pop(session, None)
            if fut.done() and not fut.cancelled():
                fut.exception()                     # a refusal after we stopped waiting: seen
            else:
                fut.cancel()

    async def attach(self, session: str, token: str, timeout: float = 10.0) -> ClientSession:
        """Take over a live session another client opened (a bridge that restarted, or another
        one the caller reached), by its resume token: the node rebinds it to this connection
        and it goes on where it was; audio numbering continues from the node's. Raises
        `Refused` ("unknown") where the node has no live session of that name and token. A
        session that ended meanwhile comes back closed, with its stats."""
        if session in self.sessions:
            raise ValueError(f"session {session!r} is already held by this client")
        s = self.sessions[session] = ClientSession(self, session, {"token": token})
        self._period_changed.set()
        s.ask_resume(again=True)
        try:
            await s.taken_over(timeout)
        except BaseException:
            self.sessions.pop(session, None)
            raise
        return s

    async def ping(self, nonce: Any = 0, timeout: float = 5.0) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._pongs[nonce] = fut
        await self.send(P.pack("ping", nonce=nonce))
        await within(fut, timeout)

    async def _read_loop(self) -> None:
        async for batch in zsock.batches(self._tx):
            self._last_heard = asyncio.get_running_loop().time()
            for frames in batch:
                try:
                    msg = P.parse(frames, P.NODE_TYPES)
                except P.ProtocolError as exc:
                    self.orphan_errors.append(Error(exc.code, f"undecodable node message: {exc}"))
                    continue
                self._dispatch(msg)

    async def _close_orphan(self, sid: str) -> None:
        try:
            await self.send(P.pack("close", sid), timeout=2.0)
        except NodeUnavailable:
            pass

    def _dispatch(self, msg: P.Message) -> None:
        h, sid = msg.header, msg.session
        if msg.type == "pong":
            fut = self._pongs.pop(h.get("nonce"), None) if sid is None else None
            if fut and not fut.done():
                fut.set_result(None)
            return
        if msg.type == "heartbeat":
            return
        if msg.type == "resumed" and sid in self.sessions:
            self.sessions[sid].resumed(h.get("seq", 0))
            return
        if msg.type == "error" and h.get("code") == P.DETACHED and sid in self.sessions:
            self.sessions[sid].ask_resume()
            return
        pending = self._pending_open.get(sid) if sid else None
        if msg.type == "opened" and pending is None and sid not in self.sessions:
            # opened after our open() gave up: close it so its slot is not held for nothing
            asyncio.get_running_loop().create_task(self._close_orphan(sid))
            return
        if pending is not None and not pending.done():
            if msg.type == "opened":
                self.sessions[sid] = s = ClientSession(self, sid, h)
                self._period_changed.set()
                pending.set_result(s)
                return
            if msg.type == "refused":
                pending.set_exception(Refused(h.get("reason", "?"), h.get("message", "")))
                return
            if msg.type == "error":            # a malformed open, or the node's own failure
                why = "internal" if h.get("code") == P.INTERNAL else "invalid"
                pending.set_exception(Refused(why, f"{h.get('code')}: {h.get('message')}"))
                return
        session = self.sessions.get(sid) if sid else None
        if session is None:
            if msg.type == "error":
                self.orphan_errors.append(Error(h.get("code", "?"), h.get("message", "")))
            return
        session.deliver(event_of(msg))
        if msg.type == "closed":
            self.sessions.pop(sid, None)
