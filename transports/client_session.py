"""One session of a `NodeClient` (`client.py`), as the application holds it: its audio out
with a replay buffer, its events in, and its side of a resume."""
from __future__ import annotations

import asyncio
import collections

from transports import protocol as P
from transports.client_events import Closed, Error, NodeUnavailable, Refused
from wave_actors.core.tasks import within

EVENT_QUEUE = 4096          # events a session buffers for a slow consumer before dropping
REPLAY = 128                # audio messages kept per session to send again after a resume
RESUME_RETRY_S = 0.5        # a session asks to resume at most this often


class ClientSession:
    def __init__(self, client, session: str, opened: dict):
        self.client, self.id, self.opened = client, session, opened
        self.events: asyncio.Queue = asyncio.Queue(EVENT_QUEUE)
        self.dropped_events = 0
        self.seq = 0
        self.closed: Closed | None = None
        self._closed_seen = asyncio.Event()   # `closed` delivered (queued or not)
        self.token: str | None = opened.get("token")
        self.resumes = 0                    # times the node rebound this session to us
        self._replay: collections.deque[tuple[int, list[bytes]]] = collections.deque(maxlen=REPLAY)
        self._last_sent = 0.0
        self._resume_asked = -1e9
        self._resume_mark = 0               # past the last seq queued when resume was asked
        self._closing = False               # `close` sent; sent again after a resume
        self.bound = asyncio.Event()        # the node has this session on our connection
        self._answered = asyncio.Event()    # bound, or an error or close came first
        self._refusal = None
        if "slot" in opened:                # opened here: bound from the start
            self.bound.set()
            self._answered.set()

    async def send_audio(self, payload: bytes, seq: int | None = None) -> None:
        if seq is None:
            seq, self.seq = self.seq, self.seq + 1
        frames = P.pack("audio", self.id, payload, seq=seq)
        self._last_sent = asyncio.get_running_loop().time()
        await self.client.send(frames)
        # Kept once queued: a send still waiting for room when a resume replays is not in the
        # buffer yet, so it goes out once, after the replay.
        self._replay.append((seq, frames))

    def ask_resume(self, again: bool = False) -> None:
        """`resume` queued, once a RESUME_RETRY_S at most; `again`: now, whenever the last was
        asked (a new connection: the last one's ask went with the old one)."""
        now = asyncio.get_running_loop().time()
        if self.closed is not None or (not again and now - self._resume_asked < RESUME_RETRY_S):
            return
        self._resume_asked = now
        # Audio queued after this `resume` reaches the node after it, on the same connection:
        # only what was queued before can have been lost.
        self._resume_mark = self._replay[-1][0] + 1 if self._replay else 0
        self.client.send_soon(P.pack("resume", self.id, token=self.token))

    def resumed(self, seq: int) -> None:
        """Send again what the node has not heard: audio from `seq` on that was queued before
        the resume was asked, still in the buffer."""
        self.resumes += 1
        self._resume_asked = -1e9
        # a session attached from another client starts its numbering where the node is
        self.seq = max(self.seq, seq)
        self.bound.set()
        self._answered.set()
        for s, frames in list(self._replay):
            if seq <= s < self._resume_mark:
                self.client.send_soon(frames)
        if self._closing and self.closed is None:
            # the node may have answered our `close` with `detached`: ask again, now bound
            self.client.send_soon(P.pack("close", self.id))

    async def taken_over(self, timeout: float) -> None:
        """After `resume` of a session another client opened: wait until the node binds it
        here (`resumed`), or answers with its end (`closed`, left for the caller to read); an
        error first (a wrong token, no such session) raises `Refused`, silence
        `NodeUnavailable`."""
        try:
            await within(self._answered.wait(), timeout)
        except asyncio.TimeoutError:
            raise NodeUnavailable(f"{self.id}: no `resumed` in {timeout:g} s") from None
        if not self.bound.is_set() and self.closed is None:
            raise Refused("unknown", f"{self.id}: {getattr(self._refusal, 'message', '')}")

    async def function_result(self, call_id: str, output: str) -> None:
        await self.client.send(P.pack("function_result", self.id, call_id=call_id, output=output))

    async def send_event(self, name: str, value: str) -> None:
        """A client-side event the model sees (`protocol.EVENT_VALUES`: a key press)."""
        await self.client.send(P.pack("event", self.id, name=name, value=value))

    async def next_event(self, timeout: float | None = None):
        return await within(self.events.get(), timeout)

    async def close(self, timeout: float = 10.0, keep_events: bool = False) -> Closed:
        """Ask the node to close; return its `closed` stats, skipping events still queued
        (`keep_events`: they stay queued for the caller, audio sent before `closed` included)."""
        if self.closed is None:
            self._closing = True
            await self.client.send(P.pack("close", self.id), timeout)
            if keep_events:
                await within(self._closed_seen.wait(), timeout)
                return self.closed
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while self.closed is None:
                await within(self.events.get(), max(0.0, deadline - loop.time()))
        return self.closed

    def deliver(self, event) -> None:
        if isinstance(event, Closed):
            self.closed = event
            self._closed_seen.set()
        if not self._answered.is_set() and isinstance(event, (Error, Closed)):
            self._refusal = event           # the node's answer to a takeover's `resume`
            self._answered.set()
        try:
            self.events.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped_events += 1
