"""OutputTurns: when the session actors' per-beat output work runs on the event loop.

A finished beat hands its outputs to every session at once, and asyncio runs every task that is
ready in one turn of the loop before it looks at its timers again. A few hundred sessions'
output work (resampling, encoding, sending) would run as one block of tens of ms; when it
reaches past the next release, the beat clock wakes late and every session's next beat is late
by as much. Two rules keep that block out of the release's way:

  - a hold: from the clock policy's release hold before a release until that beat's device
    work is queued, no output work starts (`hold` / `free`);
  - slices: at most `per_turn` pieces of work run in one turn of the loop; the rest wait, first
    come first served, for the following turns. Between two turns the loop fires its due
    timers, so the release wakes within one slice's work of its time.

Work is a callback, queued here rather than awaited in the session's actor: the actor goes on
taking its client's audio while its output waits, so a held output never delays a frame into
the next beat. Only the loop's thread uses it.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from typing import Callable

log = logging.getLogger("wave.turns")


class Turn:
    """Work queued for a later turn; `run_now` runs it at once (a session closing sends what it
    has before `closed`), `cancel` drops it (a session stopped)."""
    __slots__ = ("work",)

    def __init__(self, work: Callable[[], None]):
        self.work: Callable[[], None] | None = work

    @property
    def pending(self) -> bool:
        return self.work is not None

    def run_now(self) -> None:
        work, self.work = self.work, None
        if work is not None:
            work()

    def cancel(self) -> None:
        self.work = None


class OutputTurns:
    def __init__(self, per_turn: int = 0):
        if per_turn < 0:
            raise ValueError("per_turn must be >= 0 (0: no slicing)")
        self.per_turn = per_turn          # pieces of work run in one loop turn (0: any number)
        self._free = True
        self._left = per_turn             # of this turn's slice
        self._queue: collections.deque[Turn] = collections.deque()
        self._grant_due = False

    @property
    def held(self) -> bool:
        return not self._free

    def hold(self) -> None:
        self._free = False

    def free(self) -> None:
        self._free = True
        if self._queue:
            self._schedule()

    def run(self, work: Callable[[], None]) -> Turn | None:
        """Runs `work` now when nothing holds it and this turn's slice has room (None), else
        queues it behind the work already waiting and returns its Turn."""
        if self._free and not self._queue and (self.per_turn == 0 or self._left > 0):
            if self.per_turn:
                self._left -= 1
                self._schedule()          # next turn: a fresh slice
            work()
            return None
        turn = Turn(work)
        self._queue.append(turn)
        if self._free:
            self._schedule()
        return turn

    async def turn(self) -> None:
        """Returns when a piece of work may run (for a caller that awaits its turn)."""
        fut = asyncio.get_running_loop().create_future()
        self.run(lambda: fut.done() or fut.set_result(None))
        await fut

    def _schedule(self) -> None:
        if not self._grant_due:
            self._grant_due = True
            asyncio.get_running_loop().call_soon(self._grant)

    def _grant(self) -> None:
        """Once a turn while work waits or was just run: a fresh slice, to the queue first."""
        self._grant_due = False
        self._left = self.per_turn
        if not self._free:
            return                        # `free` schedules the next grant
        while self._queue and (self.per_turn == 0 or self._left > 0):
            turn = self._queue.popleft()
            if not turn.pending:          # run at its session's close, or cancelled
                continue
            if self.per_turn:
                self._left -= 1
            try:
                turn.run_now()
            except Exception:
                # Work reports its own failures (a session's goes to its actor); one that
                # escapes must not cost the sessions queued behind it their turn.
                log.exception("output work failed")
        if self._queue or (self.per_turn and self._left < self.per_turn):
            self._schedule()
