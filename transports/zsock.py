"""The per-frame socket traffic without pyzmq's asyncio machinery.

An awaited send or receive on a `zmq.asyncio` socket costs tens of µs of Python (futures, event
registration, flag enums, a look at the socket's events after each), and the node moves several
messages per session per beat: a client's audio in, the frame to the clock, the beat's outputs
back to the session, the audio and text out. At full load that was most of the event loop's
time. So every socket that carries them is driven here, from the loop's thread only:
  - `Tx.send`: a send that must not wait (NOBLOCK) raises at once (zmq.Again when the peer's
    queue is full, EHOSTUNREACH for a ROUTER's unknown peer) instead of returning a future;
  - `batches`: a receive loop takes every message already queued synchronously (a beat's
    outputs arrive together), up to DRAIN_MAX before it lets the loop run other tasks, and
    only an empty socket waits;
  - `Tx.wait`: the wait itself, on the socket's descriptor with a reader of our own.
The sends and receives call the compiled socket's send and recv directly (`send_now`,
`recv_now`): pyzmq's Python layer over them checks types and combines flag enums on every part,
several µs a part, which at a few hundred sessions is milliseconds of every beat.

ZMQ signals readiness on an edge-triggered descriptor: it wakes when the socket's events may
have changed, and any operation on the socket (a send included, or reading its events) may
consume that edge. So a wait first reads the events and sleeps only if what it waits for is not
there, and after any other operation on the socket its waiters look again (`Tx.kick`, once per
loop iteration at most; sends do it themselves). Without that, receives sleep through messages
that have arrived: frames are heard in bursts and overflow the jitter buffers.

A socket driven here is never awaited through pyzmq as well (pyzmq's reader would replace
ours), and it is closed through its `Tx` (the reader leaves the loop before the descriptor is
closed and its number reused).
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
POLLIN, POLLOUT, _EVENTS = int(zmq.POLLIN), int(zmq.POLLOUT), int(zmq.EVENTS)


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


def twin(sock: zmq.Socket) -> zmq.Socket:
    """A synchronous socket on the same ZMQ socket (it does not own it: close the original)."""
    return zmq.Socket.shadow(sock.underlying) if isinstance(sock, zmq.asyncio.Socket) else sock


class Tx:
    """One socket's non-blocking sends (on its synchronous twin) and its waits for readiness."""

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self.sync = twin(sock)
        self._loop: asyncio.AbstractEventLoop | None = None    # whose reader watches the fd
        self._fd = -1
        self._waiters: list[asyncio.Future] = []
        self._kick_due = False
        self._pyzmq = isinstance(sock, zmq.asyncio.Socket)

    def send(self, frames: list, copy: bool = True) -> None:
        """Queue a multipart message now or raise zmq.ZMQError (zmq.Again: no room)."""
        if self.sync.closed:          # the twin would use the freed socket: refuse like pyzmq
            raise zmq.ZMQError(zmq.ENOTSOCK)
        try:
            send_now(self.sync, frames, copy)
        finally:
            self.kick_soon()

    async def send_waiting(self, frames: list, copy: bool = True) -> None:
        """Queue a multipart message, waiting for room as long as it takes (bound it with a
        timeout around this call)."""
        while True:
            try:
                return self.send(frames, copy)
            except zmq.Again:
                await self.wait(POLLOUT)

    async def wait(self, mask: int = POLLIN) -> None:
        """Until the socket's events include `mask` (POLLIN: a message can be read; POLLOUT:
        one can be queued)."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop, self._fd, self._pyzmq = loop, self.sync.FD, False
            loop.add_reader(self._fd, self._changed)
        while not (_GET(self.sync, _EVENTS) & mask):
            fut = loop.create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if not fut.done():
                    self._waiters.remove(fut)
            if self.sync.closed:
                raise zmq.ZMQError(zmq.ENOTSOCK)

    def events(self) -> int:
        """The socket's events now (zmq.POLLIN | zmq.POLLOUT). Reading them consumes the
        descriptor's edge, so this socket's waiters are told to look too."""
        events = _GET(self.sync, _EVENTS)
        self.kick_soon()
        return events

    def _changed(self) -> None:
        """The descriptor woke (or an operation may have consumed its edge): every waiter looks
        at the events again. Reading them here resets the descriptor, which the loop would
        otherwise report again at once."""
        if self.sync.closed:
            self._unwatch()
        else:
            _GET(self.sync, _EVENTS)
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def kick_soon(self) -> None:
        """Waiters look at the events again in the next loop iteration (after an operation on
        the socket that may have consumed the descriptor's edge). None is due while nothing
        waits: a wait reads the events before it sleeps. A socket that is awaited through
        pyzmq instead (not waited on here) has pyzmq's reader look again."""
        if not self._kick_due and (self._waiters or self._pyzmq):
            self._kick_due = True
            asyncio.get_running_loop().call_soon(self.kick)

    def kick(self) -> None:
        self._kick_due = False
        if self._loop is not None:
            if self._waiters:
                self._changed()
        elif self._pyzmq and not self.sock.closed:
            self.sock._schedule_remaining_events()

    def _unwatch(self) -> None:
        if self._loop is not None:
            if not self._loop.is_closed():
                self._loop.remove_reader(self._fd)
            self._loop = None

    def close(self, linger: int | None = None) -> None:
        """Close the socket (its reader leaves the loop first); its waiters raise ENOTSOCK."""
        self._unwatch()
        self.sock.close(linger)
        self._changed()


async def batches(tx: Tx, copy: bool = True) -> AsyncIterator[list]:
    """Lists of multipart messages in arrival order: the first (waited for if none is queued),
    then the queued rest."""
    sync, waited = tx.sync, True
    while True:
        # A batch that did not wait is followed by one turn of the loop, so a busy socket still
        # lets other tasks run (before the next read: a read held across the turn could be
        # overtaken by the clock's synchronous drain at a release).
        if not waited:
            await asyncio.sleep(0)
        try:
            batch, waited = [recv_now(sync, copy)], False
        except zmq.Again:
            await tx.wait(POLLIN)
            try:
                batch, waited = [recv_now(sync, copy)], True
            except zmq.Again:           # read meanwhile by a synchronous drain
                continue
        while len(batch) < DRAIN_MAX:
            try:
                batch.append(recv_now(sync, copy))
            except zmq.Again:
                break
        yield batch


async def serve(tx: Tx, handle: Callable[[list], None], log: logging.Logger, what: str,
                copy: bool = True) -> None:
    """`handle` every message in arrival order (`batches`). A message whose handling fails is
    logged with `what` it was and skipped: a reader never ends on one bad message."""
    async for batch in batches(tx, copy):
        for parts in batch:
            try:
                handle(parts)
            except Exception:
                log.exception("failed on %s", what)
