"""The per-frame socket traffic without pyzmq's asyncio machinery where it is not needed.

An awaited send or receive on a `zmq.asyncio` socket costs tens of µs of Python (futures, event
registration, flag enums), and the node moves several messages per session per beat: a client's
audio in, the frame to the clock, the beat's outputs back to the session, the audio and text out.
At full load that is most of the event loop's time, and every millisecond of it lands in a
beat's latency. Two cheaper paths, used only from the loop's thread:
  - `Tx.send`: a send that must not wait (NOBLOCK) goes through a synchronous twin of the socket
    and raises at once (zmq.Again when the peer's queue is full, EHOSTUNREACH for a ROUTER's
    unknown peer) instead of returning a future that has to be inspected;
  - `batches`: a receive loop awaits one message, then takes what else is already queued
    synchronously (a beat's outputs arrive together), up to DRAIN_MAX before it lets the loop
    run other tasks.
Both call the compiled socket's send and recv directly (`send_now`, `recv_now`): pyzmq's Python
layer over them checks types and combines flag enums on every part, several µs a part, which at
a few hundred sessions is milliseconds of every beat.
ZMQ signals readiness on an edge-triggered descriptor, and any operation on the socket (a send
included) may consume that edge. The asyncio socket re-checks its events after its own
operations only, so after ours it is asked to (`kick`, once per loop iteration at most). Without
it, receives sleep through messages that have arrived: frames are heard in bursts and overflow the
jitter buffers.
"""
from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Callable

import zmq
import zmq.asyncio

DRAIN_MAX = 64       # a few ms of handling at most before other tasks (a finished beat) run

_SEND, _RECV, _GET = zmq.backend.Socket.send, zmq.backend.Socket.recv, zmq.backend.Socket.get
NOBLOCK, _SNDMORE, _RCVMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE), int(zmq.RCVMORE)


def send_now(sock: zmq.Socket, frames: list, copy: bool = True) -> None:
    """A multipart message (bytes or buffers) on a synchronous socket, without waiting: raises
    zmq.ZMQError (zmq.Again: no room) as pyzmq's send_multipart(flags=NOBLOCK) does. Only the
    first part can fail for room or peer: ZMQ takes the rest of a message it has begun.
    `copy=False`: large parts are handed to ZMQ as they are (the caller never writes them
    again)."""
    last = len(frames) - 1
    for i in range(last):
        _SEND(sock, frames[i], NOBLOCK | _SNDMORE, copy)
    _SEND(sock, frames[last], NOBLOCK, copy)


def recv_now(sock: zmq.Socket, copy: bool = True) -> list:
    """The next multipart message queued on a synchronous socket, or zmq.Again at once."""
    parts = [_RECV(sock, NOBLOCK, copy)]
    while _GET(sock, _RCVMORE):
        parts.append(_RECV(sock, NOBLOCK, copy))
    return parts


def twin(sock: zmq.asyncio.Socket) -> zmq.Socket:
    """A synchronous socket on the same ZMQ socket (it does not own it: close the original)."""
    return zmq.Socket.shadow(sock.underlying)


def kick(sock: zmq.Socket) -> None:
    """Make an asyncio socket look at its events again (pyzmq's own hook for this); a plain
    socket has no reader to re-arm."""
    if isinstance(sock, zmq.asyncio.Socket):
        sock._schedule_remaining_events()


class Tx:
    """Non-blocking sends on an asyncio socket's synchronous twin (or on a plain socket)."""

    def __init__(self, sock: zmq.asyncio.Socket):
        self.sock = sock
        self.sync = twin(sock)
        # A plain socket has no reader to re-arm after a send: as if a kick were always due.
        self._kick_due = not isinstance(sock, zmq.asyncio.Socket)

    def send(self, frames: list, copy: bool = True) -> None:
        """Queue a multipart message now or raise zmq.ZMQError (zmq.Again: no room)."""
        if self.sock.closed:          # the twin would use the freed socket: refuse like pyzmq
            raise zmq.ZMQError(zmq.ENOTSOCK)
        try:
            send_now(self.sync, frames, copy)
        finally:
            if not self._kick_due:
                self._kick_due = True
                asyncio.get_running_loop().call_soon(self._kick)

    def _kick(self) -> None:
        self._kick_due = False
        if not self.sock.closed:
            kick(self.sock)


async def batches(sock: zmq.asyncio.Socket, sync: zmq.Socket, copy: bool = True
                  ) -> AsyncIterator[list]:
    """Lists of multipart messages in arrival order: the first (awaited if none is queued),
    then the queued rest."""
    waited = True
    while True:
        # A message already queued is taken without pyzmq's futures, and only an empty socket
        # is awaited; a batch that did not wait is followed by one turn of the loop, so a busy
        # socket still lets other tasks run (before the next read: a read held across the turn
        # could be overtaken by the clock's synchronous drain at a release).
        if not waited:
            await asyncio.sleep(0)
        try:
            batch, waited = [recv_now(sync, copy)], False
        except zmq.Again:
            batch, waited = [await sock.recv_multipart(copy=copy)], True
        while len(batch) < DRAIN_MAX:
            try:
                batch.append(recv_now(sync, copy))
            except zmq.Again:
                break
        kick(sock)
        yield batch


async def serve(sock: zmq.asyncio.Socket, sync: zmq.Socket, handle: Callable[[list], None],
                log: logging.Logger, what: str, copy: bool = True) -> None:
    """`handle` every message in arrival order (`batches`). A message whose handling fails is
    logged with `what` it was and skipped: a reader never ends on one bad message."""
    async for batch in batches(sock, sync, copy):
        for parts in batch:
            try:
                handle(parts)
            except Exception:
                log.exception("failed on %s", what)
