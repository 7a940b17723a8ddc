"""Giving freed heap memory back to the system (glibc's `malloc_trim`).

A bridge's traffic comes in bursts: a client's large frames, a flood of connections, a fuzzer.
glibc keeps the pages such a burst freed inside its heap for later allocations, so a process's
resident memory stays at its largest burst and climbs a step with each larger one, though
nothing is held (a soak reads those steps as a leak).
`trim()` hands every whole free page back (`malloc_trim(0)`); `Trimmer` runs it a while after
work ended (a call, a connection), at most once per `delay_s`, off the hot path of the work
itself. Elsewhere than glibc both do nothing.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util


def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):           # not glibc (musl, macOS): nothing to trim
        return None


_TRIM = _malloc_trim()


def trim() -> bool:
    """Free heap pages back to the system; whether there was a heap to trim (glibc)."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


class Trimmer:
    """`soon()` after a piece of work ends: one `trim()` `delay_s` later, however many ends
    came meanwhile."""

    def __init__(self, delay_s: float = 5.0):
        self.delay_s = delay_s
        self.trims = 0
        self._pending: asyncio.TimerHandle | None = None

    def soon(self) -> None:
        if self._pending is None and _TRIM is not None:
            self._pending = asyncio.get_running_loop().call_later(self.delay_s, self._run)

    def _run(self) -> None:
        self._pending = None
        trim()
        self.trims += 1

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
