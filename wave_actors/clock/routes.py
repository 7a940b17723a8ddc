"""Where a beat's outputs go: the clock hands each beat's routed rows to a `BeatRoute`.

`ToSessions` hands each session's rows to its owner in the clock's own process (the node's
`deliver`: a session actor's mailbox). The engine process routes to session workers instead
(`engine/to_workers.py`): its buffers are shared memory the workers map, and each worker gets
one message a beat. The clock is the same either way; only its route differs.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Protocol

import numpy as np

from wave_actors.core.frames import ALL_FRAMES
from wave_actors.core.sched.session_table import Routed
from wave_actors.clock.shared_outputs import BeatOut
from wave_actors.clock.view import ClockView

# Hands a session's beat outputs to its owner (what the node gave at admission); False when
# the owner cannot take them (not started yet, or gone).
Deliver = Callable[[Any, BeatOut], bool]


class _Lease:
    """One `take` of a pooled buffer as numpy sees it: every view of the rows handed out (and
    every view of those) keeps this object alive through its `base`, so the buffer is free
    again exactly when the last of them is gone (a `weakref.finalize`), whatever the Python
    version counts in its reference counts."""

    def __init__(self, buf: np.ndarray):
        self.buf = buf
        self.__array_interface__ = buf.__array_interface__


class RowPool:
    """Reused host buffers for the rows a beat routes. `take` copies rows of `src` into a buffer
    that no session still holds a row of, and returns the filled part: a fresh array a beat would
    page-fault as it is first written, on the route's critical path. A session that holds its
    rows for long only makes the pool grow, to `keep` buffers, then allocate."""

    def __init__(self, keep: int = 8):
        self.keep = keep
        self._bufs: list[np.ndarray] = []
        self._busy: list[bool] = []

    def take(self, src: np.ndarray, rows: np.ndarray) -> np.ndarray:
        n = len(rows)
        for i, buf in enumerate(self._bufs):
            if not self._busy[i] and buf.shape == src.shape:
                break
        else:
            if len(self._bufs) >= self.keep:      # all held: a buffer of its own, not pooled
                return np.take(src, rows, axis=0, mode="clip")
            i, buf = len(self._bufs), np.empty_like(src)
            self._bufs.append(buf)
            self._busy.append(False)
        self._busy[i] = True
        lease = _Lease(buf)
        weakref.finalize(lease, self._free, i)
        return np.take(src, rows, axis=0, out=np.asarray(lease)[:n], mode="clip")

    def _free(self, i: int) -> None:
        self._busy[i] = False

    @property
    def held(self) -> int:
        """Buffers of the pool some session still holds a row of."""
        return sum(self._busy)


class BeatRoute(Protocol):
    def attach(self, clock: ClockView) -> None:
        """The clock it routes for (its table, stats and socket), once, as the clock is made."""

    def outputs(self, executor) -> list:
        """The ring of two output buffers: beat k's outputs land in buffer k % 2."""

    def refilling(self, index: int) -> None:
        """Output buffer `index` is handed to the executor (its last beat's rows are routed)."""

    def filled(self, index: int) -> None:
        """Output buffer `index` holds the beat just collected."""

    def admitted(self, slot: int) -> None:
        """A new session holds `slot`: nothing of the slot's last owner may reach it."""

    def greet(self, sender: bytes, force: bool = False) -> None:
        """A sender of frames was heard (`force`: again, as a restarted one)."""

    def send(self, routed: Routed, out, frames: slice | None = None) -> None:
        """The routed rows of `out` (those `frames` of the beat) to their sessions."""


class ToSessions:
    """Outputs to owners in this process: once a beat (or frame), not per session, and only the
    routed rows: the token rows become lists in one tolist() each, and the PCM rows are copied
    out in one piece into a reused buffer (the ring slot is refilled two beats on; sessions
    read their rows later). Its buffers are the executor's own, and its senders need no word
    of where frames go, so `refilling`, `filled`, `admitted` and `greet` have nothing to do."""

    def __init__(self, deliver: Deliver):
        self.deliver = deliver
        self.clock: ClockView | None = None
        self._pcm_rows = RowPool()

    def attach(self, clock: ClockView) -> None:
        self.clock = clock

    def outputs(self, executor) -> list:
        return [executor.alloc_output(), executor.alloc_output()]

    def refilling(self, index: int) -> None:
        return None

    def filled(self, index: int) -> None:
        return None

    def admitted(self, slot: int) -> None:
        return None

    def greet(self, sender: bytes, force: bool = False) -> None:
        return None

    def send(self, routed: Routed, out, frames: slice | None = None) -> None:
        if not routed:
            return
        frames = frames or ALL_FRAMES
        rows = routed.slots
        text, func, user = (a[rows, frames].tolist() for a in (out.text, out.func, out.user))
        pcm = self._pcm_rows.take(out.pcm[:, frames], rows)
        clock = self.clock
        for i, (entry, first_frame) in enumerate(clock.slots.table.entries_of(routed)):
            header = {"frame": first_frame + frames.start, "text": text[i], "func": func[i],
                      "user": user[i]}
            if not self.deliver(entry.owner, BeatOut(header, pcm[i])):
                clock.stats.unroutable += 1
