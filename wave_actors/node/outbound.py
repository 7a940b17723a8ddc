"""The front's way out: messages to clients on the node's socket, never blocking the node.

A client that is not reading loses `droppable` messages (audio, counted); anything else waits for
it in a task, bounded by SEND_TIMEOUT_S. A session detached from its connection has its
messages held for its resume (up to HELD_MAX; audio is not held). Errors and refusals are
counted by code and reason as they are sent.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import zmq

from transports import protocol as P
from wave_actors.core.tasks import within
from wave_actors.node.bindings import Route

if TYPE_CHECKING:
    from wave_actors.node.node import Node

log = logging.getLogger("wave.node")
SEND_TIMEOUT_S = 5.0
HELD_MAX = 256              # messages other than audio kept for a detached session


class Outbound:
    def __init__(self, node: "Node"):
        self.node = node

    def send(self, identity: bytes, frames: list[bytes], droppable: bool = False) -> bool:
        """Send to a client without blocking the node. A client that is not reading loses
        `droppable` messages (audio, counted); anything else waits for it in a task, bounded
        by SEND_TIMEOUT_S. False when the message did not go out now.

        A send that finds no peer (EHOSTUNREACH) proves nothing: with ROUTER_MANDATORY, libzmq
        also says so for a live peer whose pipe was full a moment ago and is draining. It is
        counted, and liveness is left to the heartbeats and to the probe at a new connection."""
        try:
            self.node.tx.send([identity, *frames])
            return True
        except zmq.ZMQError as exc:
            unreachable = exc.errno == zmq.EHOSTUNREACH
        if unreachable:
            self.node.metrics.drops.labels("client_gone").inc()
            return False
        if droppable:
            self.node.metrics.drops.labels("client_not_reading").inc()
            return False
        self.node.spawn(self._later(identity, frames))
        return False

    def to_route(self, route: Route, frames: list[bytes], droppable: bool = False) -> bool:
        """A session's message to its client: to the connection it is bound to, or, while it is
        detached, held for its resume (audio is not held: it is counted by the caller)."""
        if route.detached_at is None:
            return self.send(route.identity, frames, droppable)
        if not droppable:
            if len(route.held) < HELD_MAX:
                route.held.append(frames)
            else:
                self.node.counters.held_lost += 1
        return False

    async def _later(self, identity: bytes, frames: list[bytes]) -> None:
        try:
            await within(self.node.sock.send_multipart([identity, *frames]), SEND_TIMEOUT_S)
        except (asyncio.TimeoutError, zmq.ZMQError):
            self.node.metrics.drops.labels("client_not_reading").inc()

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
