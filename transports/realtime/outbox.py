"""A bounded per-connection send queue: a client that stops reading cannot grow the bridge.

Serialized server events wait here for the connection's writer. Audio deltas are droppable: once
`max_bytes` are queued a new one is dropped and counted instead. Every other event (transcripts,
function calls, errors, lifecycle) is kept, up to `hard_bytes`; past that the queue refuses it
and the connection must close. `full_since` tells the owner how long the reader has been stalled
(audio being dropped), so it can close after a grace period.

Invariant: `size <= hard_bytes` at all times, and `size <= max_bytes` counting only audio.
"""
from __future__ import annotations

import asyncio
from collections import deque


class Overflow(Exception):
    """A non-droppable event did not fit: the reader is gone for good."""


class Outbox:
    def __init__(self, max_bytes: int, hard_bytes: int, now=None):
        assert 0 < max_bytes <= hard_bytes
        self.max_bytes, self.hard_bytes = max_bytes, hard_bytes
        self._q: deque[str] = deque()
        self._ready = asyncio.Event()
        self._now = now or asyncio.get_running_loop().time
        self.size = 0                   # bytes (characters) queued now
        self.high_water = 0             # the most ever queued
        self.dropped = 0                # audio deltas dropped
        self.dropped_bytes = 0
        self.full_since: float | None = None   # when audio started being dropped; None: flowing

    def put(self, text: str, droppable: bool) -> bool:
        """Queue one event; False if it was a droppable one that did not fit."""
        n = len(text)
        if droppable and self.size + n > self.max_bytes:
            self.dropped += 1
            self.dropped_bytes += n
            if self.full_since is None:
                self.full_since = self._now()
            return False
        if self.size + n > self.hard_bytes:
            raise Overflow(f"{self.size + n} bytes queued for a client that does not read")
        self._q.append(text)
        self.size += n
        self.high_water = max(self.high_water, self.size)
        self._ready.set()
        return True

    def stalled_for(self) -> float:
        return 0.0 if self.full_since is None else self._now() - self.full_since

    async def get(self) -> str:
        while not self._q:
            self._ready.clear()
            await self._ready.wait()
        text = self._q.popleft()
        self.size -= len(text)
        if self.size <= self.max_bytes // 2:
            self.full_since = None      # the reader caught up
        return text

    def __len__(self) -> int:
        return len(self._q)
