"""The front's way in: every message on the node's socket, parsed (`protocol.parse`), checked
against the sender's connection and flood limit, and handed to the session it names, or
opened. Malformed input is answered with `error` (an open with `refused`) and counted; nothing
a peer sends crashes the front or touches another sender's session.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import zmq

from transports import protocol as P
from transports import zsock
from wave_actors.clock.clock import Admit
from wave_actors.core.contract import SessionSpec
from wave_actors.core.frames import FRAME_S
from wave_actors.core.prompt import PromptRejected
from wave_actors.core.sched.jitter import AdmissionRefused, CapacityError
from wave_actors.node.bindings import Route
from wave_actors.node.gatekeeper import CONN_PROPERTY
from wave_actors.node.view import NodeView
from wave_actors.runtime.actors import ActorStopped, MailboxFull, MsgClass
from wave_actors.sessions.hosts import HostedSession
from wave_actors.sessions.messages import AudioIn, Close, FunctionResult, SessionConfig

log = logging.getLogger("wave.node")


def _zero_stats() -> dict:
    return {"frames_in": 0, "frames_out": 0, "underruns": 0, "dropped": 0, "late_beats": 0,
            "dropped_in": 0, "dropped_out": 0}


def _older(conn: str, than: str) -> bool:
    """Connection numbers grow (gatekeeper.py); inproc connections have none."""
    return conn.isdigit() and than.isdigit() and int(conn) < int(than)


class Inbound:
    """The node's message handlers, one `_on_<type>` a message type."""

    def __init__(self, node: NodeView):
        self.node = node

    async def run(self) -> None:
        async for batch in zsock.batches(self.node.tx, copy=False):
            for raw in batch:
                try:
                    self._on_frames(raw)
                except Exception:
                    # The front survives anything a peer sends; a bug here is logged and counted.
                    log.exception("front: unexpected failure handling a message")
                    self.node.metrics.errors.labels(P.INTERNAL).inc()

    @staticmethod
    def _property(frame, name: str) -> str | None:
        try:
            return frame.get(name)
        except zmq.ZMQError:            # not carried (inproc has no handshake)
            return None

    def _on_frames(self, raw: list) -> None:
        identity, head = raw[0].bytes, raw[0]
        conn = self._property(head, CONN_PROPERTY) or ""
        now = self.node.clock.now()
        peer = self.node.bindings.peers.get(identity)
        if peer is not None and peer.conn != conn and _older(conn, peer.conn):
            # A straggler of a connection this identity has since replaced (read after the new
            # one's messages): its sessions live on the new one, which sends again what they
            # did not hear (resume), so it belongs to no session now.
            self.node.counters.superseded += 1
            return
        if peer is None or peer.conn != conn:
            user_key = self._property(head, "User-Id") if self.node.cfg.curve_keys else None
            sender = user_key or self._property(head, "Peer-Address") or identity.hex()
            peer = self.node.bindings.connected(identity, conn, now, sender, user_key)
        peer.heard = now
        user_key, sender = peer.user_key, peer.sender
        try:
            msg = P.parse([f.bytes for f in raw[1:]])
        except P.ProtocolError as exc:
            if self._admit_rate(identity, sender, now):
                self._reply_protocol_error(identity, exc)
            return
        # `close` is never rate-limited: shedding load must not keep a session alive.
        if msg.type != "close" and not self._admit_rate(identity, sender, now):
            if msg.type == "audio":
                route, _code, _why = self.node.bindings.check(identity, user_key, conn, msg.session)
                if route is not None:
                    route.actor.count_flooded(msg.payload, msg.header["seq"])
            return
        getattr(self, f"_on_{msg.type}")(identity, user_key, conn, sender, msg)

    def _reply_protocol_error(self, identity: bytes, exc: P.ProtocolError) -> None:
        if exc.msg_type == "open" and exc.session:
            # The opener waits for opened/refused: answer in those terms, and count it.
            self.node.counters.errors[exc.code] = self.node.counters.errors.get(exc.code, 0) + 1
            self.node.metrics.errors.labels(exc.code).inc()
            self.node.out.refuse(identity, exc.session, "invalid", exc.message)
        else:
            self.node.out.error(identity, exc.code, exc.message, exc.session)

    def _admit_rate(self, identity: bytes, sender: str, now: float) -> bool:
        node = self.node
        ok, notice = node.flood.admit(sender, node.bindings.sessions_of.get(sender, 0), now)
        if not ok:
            self.node.counters.flood_drops += 1
            self.node.metrics.drops.labels("flood").inc()
            if notice is not None:
                node.out.error(identity, P.OVERLOADED,
                               f"too many messages from this sender: {notice} dropped since "
                               f"the last notice (at most one notice every "
                               f"{node.cfg.flood.notice_interval_s:g} s)")
        return ok

    def _on_ping(self, identity: bytes, user_key, conn, sender, msg: P.Message) -> None:
        if msg.session is not None:
            # A session's own heartbeat keeps it from idling. One naming a session that is not
            # (or no longer) bound here refreshes nothing, and is answered all the same: a
            # heartbeat racing its session's `close` is no error.
            route, _code, _why = self.node.bindings.check(identity, user_key, conn, msg.session)
            if route is not None:
                route.last_heard = self.node.clock.now()
        self.node.out.send(identity, P.pack("pong", msg.session, nonce=msg.get("nonce")))

    def _bound_route(self, identity: bytes, user_key, conn: str, msg: P.Message) -> Route | None:
        """The opened session a message names, if this connection may drive it; else the
        sender gets an error saying why, and None."""
        route, code, why = self.node.bindings.check(identity, user_key, conn, msg.session)
        if route is None:
            self.node.out.error(identity, code, why, msg.session)
            return None
        route.last_heard = self.node.clock.now()
        return route

    def _on_audio(self, identity: bytes, user_key, conn, sender, msg: P.Message) -> None:
        route = self._bound_route(identity, user_key, conn, msg)
        if route is not None:
            seq = msg.header["seq"]
            route.next_seq = max(route.next_seq, seq + 1)
            try:
                route.actor.tell(AudioIn(seq, msg.payload), MsgClass.AUDIO)
            except ActorStopped:            # its session is ending (its worker died)
                self.node.metrics.drops.labels("session_gone").inc()

    def _on_function_result(self, identity: bytes, user_key, conn, sender, msg: P.Message) -> None:
        route = self._bound_route(identity, user_key, conn, msg)
        if route is not None:
            self._tell_control(identity, route.actor,
                               FunctionResult(msg.get("call_id"), msg.get("output")))

    def _on_event(self, identity: bytes, user_key, conn, sender, msg: P.Message) -> None:
        """A client-side event (a key press) reaches the model the only way text reaches it
        mid-call: as a tool response in its function channel, `{"event": name, "value": v}`."""
        route = self._bound_route(identity, user_key, conn, msg)
        if route is not None:
            output = json.dumps({"event": msg.header["name"], "value": msg.header["value"]})
            self._tell_control(identity, route.actor,
                               FunctionResult(f"event:{msg.header['name']}", output))

    def _on_close(self, identity: bytes, user_key, conn, sender, msg: P.Message) -> None:
        route = self.node.bindings.get(identity, msg.session)
        if route is not None and route.actor is None and route.owner_key == user_key \
                and route.conn == conn:
            # Closed before `opened`: its open stops (cancelling its start, freeing its slot)
            # and answers `closed`.
            route.cancelled = True
            if route.ready is not None and not route.ready.done():
                route.ready.cancel()
            return None
        route = self._bound_route(identity, user_key, conn, msg)
        if route is not None:
            self._tell_control(identity, route.actor, Close("client"))

    def _on_resume(self, identity: bytes, user_key, conn, sender, msg: P.Message) -> None:
        """Rebind a session to this connection: by its token, or under CURVE by the key that
        opened it. A session that closed meanwhile answers with its `closed` stats."""
        b, token = self.node.bindings, msg.get("token")
        route = b.resumable(msg.session, token, user_key)
        if route is None:
            stats = b.closed_stats(msg.session, token, user_key)
            if stats is not None:
                self.node.out.send(identity, P.pack("closed", msg.session, stats=stats))
            else:
                self.node.out.error(identity, P.UNKNOWN_SESSION,
                                    f"no session {msg.session!r} to resume with this token or key",
                                    msg.session)
            return
        if not b.rebind(route, identity, conn, self.node.clock.now()):
            self.node.out.error(identity, P.BAD_HEADER,
                                f"session {msg.session!r} is already open on this connection "
                                "under another token", msg.session)
            return
        # The next seq is the front's view: audio it accepted may still wait in the actor's
        # mailbox, and sent again it would be a duplicate.
        seq = max(route.next_seq, route.actor.expected_seq)
        self.node.out.send(identity, P.pack("resumed", msg.session, seq=seq,
                                            out_seq=route.actor.out_seq))
        while route.held:
            self.node.out.send(identity, route.held.popleft())

    def _tell_control(self, identity: bytes, actor: HostedSession, msg: Any) -> None:
        try:
            actor.tell(msg)
        except (ActorStopped, MailboxFull) as exc:
            self.node.out.error(identity, P.OVERLOADED, f"session cannot take messages: {exc}",
                                actor.cfg.session)

    def _on_open(self, identity: bytes, user_key, conn, sender, msg: P.Message) -> None:
        key = (identity, msg.session)
        if self.node.draining:
            return self.node.out.refuse(identity, msg.session, "draining",
                                        "the node is shutting down")
        if key in self.node.routes:
            return self.node.out.refuse(identity, msg.session, "duplicate",
                                        f"session {msg.session!r} is already open on this "
                                        "connection")
        route = Route(identity, msg.session, user_key, sender, conn)
        self.node.bindings.add(route)
        opening = self._open(route, msg, self.node.clock.now())
        task = asyncio.get_running_loop().create_task(opening)
        self.node.opens.add(task)
        task.add_done_callback(self.node.opens.discard)
    async def _open(self, route: Route, msg: P.Message, read: float) -> None:
        """`read`: when the front read the open (its phases are timed from there)."""
        clock, now = self.node.clock_actor, self.node.clock.now
        handle = await self._admit(route, msg, clock)
        if handle is None:
            return None
        admitted = now()
        route.handle = handle
        # `opened` waits for the model's session start (its prompt's rows ride the next beats;
        # a kept prompt's one-copy start is ready at admission, `Slots.admit`), so the client
        # streams only once its audio will be heard; audio sent during a start by rows would
        # queue, overflow and be dropped.
        ready = route.ready = clock.when_ready(handle)
        if (route.cancelled or self.node.draining) and not ready.done():
            ready.cancel()
        try:
            await asyncio.wait({ready}, timeout=self.node.cfg.start_timeout_s)
        finally:
            route.ready = None
        answered = ready.done() and not ready.cancelled()
        started = now()
        if self.node.draining or route.cancelled or not (answered and ready.result()):
            await self.node.free_slot(handle)
            self.node.bindings.drop(route)
            return self._answer_failed_open(route, answered)
        h = msg.header
        cfg = SessionConfig(msg.session, handle, h["sample_rate"], h["format"],
                            h["output_sample_rate"], h["output_format"], clock.endpoint,
                            hold_frames=max(1, round(self.node.cfg.input_hold_s / FRAME_S)))
        try:
            route.actor = self.node.host.open(cfg, route)
        except ActorStopped as exc:
            await self.node.free_slot(handle)
            self.node.bindings.drop(route)
            return self.node.out.refuse(route.identity, msg.session, "capacity",
                                        f"node not ready: {exc}")
        self.node.host.bind(clock, route.actor)
        self.node.bindings.opened(route, self.node.clock.now())
        self.node.counters.opened += 1
        self.node.metrics.opened.inc()
        self.node.update_gauges()
        for listen in self.node.session_listeners:
            listen("opened", msg.session)
        self.node.out.send(route.identity, P.pack(
            "opened", msg.session, frame_ms=80, beat_ms=160,
            output_sample_rate=cfg.output_sample_rate, output_format=cfg.output_format,
            slot=handle.slot, token=route.token,
            heartbeat_ms=round(1000 * self.node.cfg.heartbeat_s),
            resume_ms=round(1000 * self.node.cfg.resume_grace_s),
            idle_ms=round(1000 * self.node.cfg.idle_timeout_s)))
        self.node.metrics.open_timed((admitted - read, started - admitted, now() - started))

    async def _admit(self, route: Route, msg: P.Message, clock):
        """The clock's slot for this open, or None once the opener was refused (or told
        `internal`: a bug, logged with its stack and counted; no other session is touched
        and the front reads on)."""
        h = msg.header
        refuse = self.node.out.refuse
        if clock is None:                    # between a clock's crash and its restart
            self.node.bindings.drop(route)
            refuse(route.identity, msg.session, "capacity",
                   "node not ready: the beat clock is restarting")
            return None
        try:
            return await clock.ask(Admit((route.identity, route.session), route,
                                         SessionSpec(h["instructions"], h["tools"])))
        except AdmissionRefused as exc:
            reason, why = "admission", str(exc)
        except CapacityError as exc:
            reason, why = "capacity", str(exc)
        except PromptRejected as exc:
            reason, why = "invalid", str(exc)
        except (ActorStopped, asyncio.TimeoutError) as exc:
            reason, why = "capacity", f"node not ready: {exc!r}"
        except Exception:
            log.exception("admitting session %r failed", msg.session)
            self.node.bindings.drop(route)
            self.node.out.error(route.identity, P.INTERNAL, "the node failed to admit the "
                                "session (an internal error, logged)", msg.session)
            return None
        self.node.bindings.drop(route)
        refuse(route.identity, msg.session, reason, why)
        return None

    def _answer_failed_open(self, route: Route, answered: bool) -> None:
        identity, session = route.identity, route.session
        if self.node.draining:
            return self.node.out.refuse(identity, session, "draining",
                                        "the node is shutting down")
        if route.cancelled:                         # the client closed it while it started
            self.node.out.send(identity, P.pack("closed", session, stats=_zero_stats()))
            return None
        if answered:                                # its clock went away mid-start
            return self.node.out.refuse(identity, session, "capacity",
                                        "the engine restarted while the session was starting")
        return self.node.out.refuse(identity, session, "capacity",
                                    f"the model did not finish starting the session within "
                                    f"{self.node.cfg.start_timeout_s:.0f} s (node overloaded)")
