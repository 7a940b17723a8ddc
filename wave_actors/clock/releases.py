"""Releases a few at a time: a mass hang-up must not hold the clock's loop in one piece.

A release costs the clock tens to hundreds of µs of host work (its queued frames pulled and
counted, its jitter statistics, the slot freed). One release is nothing, but callers that hang
up together (a bench's end, a caller's network going down, a drained node) all become ready
in the same turn of the event loop, and asyncio runs every ready callback of a turn before it
looks at I/O or timers again. A few hundred releases in one turn held the loop for tens of ms:
the beat that finished meanwhile was routed that much later, and a drain beat ran late. Here
each turn of the loop runs at most `per_turn` releases, in the order they were asked, then
yields, so a finished beat or a release waits behind one batch at most.
"""
from __future__ import annotations

import asyncio
import collections
from typing import Callable

from wave_actors.core.contract import Handle
from wave_actors.core.sched.jitter import SlotStats

RELEASES_PER_TURN = 16      # ~1-3 ms of host work a turn; 300 hang-ups take ~20 turns


class Releases:
    def __init__(self, release: Callable[[Handle], SlotStats | None],
                 per_turn: int = RELEASES_PER_TURN):
        if per_turn < 1:
            raise ValueError("Releases: per_turn must be >= 1")
        self._release, self.per_turn = release, per_turn
        self._queue: collections.deque[tuple[Handle, asyncio.Future]] = collections.deque()
        self._pacer: asyncio.Task | None = None
        self.turns = 0              # loop turns that ran releases (a mass close: several)

    async def release(self, handle: Handle) -> SlotStats | None:
        """The slot's release, in a later turn of the loop (the next one unless `per_turn`
        others are ahead of it); its stats (None: a stale handle)."""
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((handle, fut))
        if self._pacer is None:      # a task of its own: an asker cancelled leaves the rest
            self._pacer = asyncio.get_running_loop().create_task(self._pace())
        return await fut

    async def _pace(self) -> None:
        """The queue, `per_turn` releases a turn of the loop, in the order asked; a release
        that raises fails its own asker only."""
        try:
            while True:
                self.turns += 1
                for _ in range(min(self.per_turn, len(self._queue))):
                    handle, fut = self._queue.popleft()
                    if fut.done():                  # its asker gave up
                        continue
                    try:
                        fut.set_result(self._release(handle))
                    except Exception as exc:        # noqa: BLE001 - the asker's failure
                        fut.set_exception(exc)
                if not self._queue:
                    return
                await asyncio.sleep(0)
        finally:
            self._pacer = None

    def forget(self) -> None:
        """The clock stops: askers still queued learn it at once."""
        if self._pacer is not None:
            self._pacer.cancel()
        while self._queue:
            _, fut = self._queue.popleft()
            if not fut.done():
                fut.cancel()
