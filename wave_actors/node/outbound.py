"""The front's way out: messages to clients on the node's socket, in order, never blocking the
node.

Per client (routing identity) messages leave in the order they were sent. Once one cannot go
out now (the client's pipe is full: it is not reading), it and every later message to that
client wait in the client's queue, which a task sends on as the pipe takes them. The queue is
bounded: past `QUEUED_AUDIO` audio messages the oldest audio is shed (counted in its session's
`dropped_out`); nothing else is ever shed. A client whose queue has not moved for the
liveness limit (`silence_limit_s`) is not reading: its sessions are detached (as a client gone
silent is), their waiting messages other than audio kept for a resume (up to HELD_MAX each),
the rest counted.

A session detached from its connection has its messages held for its resume (audio is not held:
its session counts it). Errors and refusals are counted by code and reason as they are sent.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass, field

import zmq

from transports import protocol as P
from wave_actors.node.bindings import Route
from wave_actors.node.view import NodeView

log = logging.getLogger("wave.node")
HELD_MAX = 256              # messages other than audio kept for a detached session
QUEUED_AUDIO = 64           # audio messages a client's queue keeps (~2.5 s of one session's)
RETRY_S = 0.01              # how often a waiting queue tries its client's pipe again


@dataclass
class _Queue:
    """A client's messages waiting their turn: (frames, droppable, route or None)."""
    msgs: collections.deque = field(default_factory=collections.deque)
    audio: int = 0
    task: asyncio.Task | None = None


class Outbound:
    def __init__(self, node: NodeView):
        self.node = node
        self._queues: dict[bytes, _Queue] = {}

    def send(self, identity: bytes, frames: list[bytes], droppable: bool = False,
             route: Route | None = None) -> bool:
        """Send to a client without blocking the node; True when it went out now or waits in
        the client's queue (in order, behind what waits there already). False: not sent, and
        counted (audio to a client not reading, or anything to a client the socket does not know
        that no session of it waits for).

        A send that finds no peer (EHOSTUNREACH) proves nothing: with ROUTER_MANDATORY, libzmq
        also says so for a live peer whose pipe was full a moment ago and is draining. A
        session's message other than audio then waits its turn like any message to a slow
        client, and liveness is left to the heartbeats and to the probe at a new connection;
        a reply that belongs to no session (a pong, an error) is counted and not retried: a
        peer gone for good would otherwise keep a queue polling for the liveness limit."""
        q = self._queues.get(identity)
        if q is None:
            try:
                self.node.tx.send([identity, *frames])
                return True
            except zmq.ZMQError as exc:
                gone = exc.errno == zmq.EHOSTUNREACH
            if droppable or (gone and route is None):
                self.node.metrics.drops.labels("client_gone" if gone else
                                               "client_not_reading").inc()
                return False
            q = self._queues[identity] = _Queue()
            q.task = self.node.spawn(self._drain(identity, q))
        q.msgs.append((frames, droppable, route))
        if droppable:
            q.audio += 1
            if q.audio > QUEUED_AUDIO:
                self._shed_oldest_audio(q)
        return True

    def to_route(self, route: Route, frames: list[bytes], droppable: bool = False) -> bool:
        """A session's message to its client: to the connection it is bound to, or, while it is
        detached, held for its resume (audio is not held: it is counted by the caller)."""
        if route.detached_at is None:
            return self.send(route.identity, frames, droppable, route)
        if not droppable:
            self._hold(route, frames)
        return False

    def queued(self, identity: bytes) -> int:
        """Messages waiting for this client (0: its messages go out as they are sent)."""
        q = self._queues.get(identity)
        return len(q.msgs) if q else 0

    def _hold(self, route: Route, frames: list[bytes]) -> None:
        if len(route.held) < HELD_MAX:
            route.held.append(frames)
        else:
            self.node.counters.held_lost += 1

    def _shed_oldest_audio(self, q: _Queue) -> None:
        for i, (_frames, droppable, route) in enumerate(q.msgs):
            if droppable:
                del q.msgs[i]
                q.audio -= 1
                self._lost_audio(route)
                return

    def _lost_audio(self, route: Route | None) -> None:
        self.node.metrics.drops.labels("client_not_reading").inc()
        if route is not None:
            route.shed_out += 1

    async def _drain(self, identity: bytes, q: _Queue) -> None:
        """Sends the client's queue in order as its pipe takes it; detaches the client when its
        queue has not moved for the liveness limit."""
        clock, limit = self.node.clock, self.node.cfg.silence_limit_s
        moved = clock.now()
        try:
            while q.msgs:
                frames, droppable, _route = q.msgs[0]
                try:
                    self.node.tx.send([identity, *frames])
                except zmq.ZMQError as exc:
                    if exc.errno not in (zmq.EAGAIN, zmq.EHOSTUNREACH):
                        raise
                    if clock.now() - moved > limit:
                        return self._give_up(identity, q)
                    await clock.sleep(RETRY_S)
                    continue
                q.msgs.popleft()
                q.audio -= droppable
                moved = clock.now()
        finally:
            if self._queues.get(identity) is q:
                del self._queues[identity]

    def _give_up(self, identity: bytes, q: _Queue) -> None:
        """The client read nothing for the liveness limit: its sessions are detached and keep
        their waiting messages (audio aside) for a resume; the rest is counted as lost."""
        log.info("client %r read nothing for %.1f s: %d messages waiting; its sessions detach",
                 identity, self.node.cfg.silence_limit_s, len(q.msgs))
        self.detach_identity(identity, "not reading")
        while q.msgs:
            frames, droppable, route = q.msgs.popleft()
            if droppable:
                self._lost_audio(route)
            elif route is not None and route.detached_at is not None:
                self._hold(route, frames)
            else:
                self.node.metrics.drops.labels("client_not_reading").inc()
        q.audio = 0

    def error(self, identity: bytes, code: str, message: str, session: str | None = None) -> None:
        self.node.counters.errors[code] = self.node.counters.errors.get(code, 0) + 1
        self.node.metrics.errors.labels(code).inc()
        self.send(identity, P.error_frames(code, message, session))

    def refuse(self, identity: bytes, session: str, reason: str, message: str) -> None:
        self.node.counters.refusals[reason] = self.node.counters.refusals.get(reason, 0) + 1
        self.node.metrics.refusals.labels(reason).inc()
        self.send(identity, P.pack("refused", session, reason=reason, message=message))

    def detach_identity(self, identity: bytes, why: str) -> None:
        log.debug("sessions of %r detached (%s)", identity, why)
        self.node.bindings.detach_identity(identity, self.node.clock.now())

    def probe_bound(self) -> None:
        """A connection is about to be attached: every routing identity with bound sessions is
        probed, so one whose connection is gone detaches its sessions before the newcomer can
        take its identity (gatekeeper.py)."""
        frames = P.pack("heartbeat")
        for identity in self.node.bindings.bound_identities():
            try:
                self.node.tx.send([identity, *frames])
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EHOSTUNREACH:
                    self.detach_identity(identity, "unreachable at a new connection")
