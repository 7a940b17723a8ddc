"""Time for the node: a real monotonic clock, and a virtual-time event loop for simulation.

Every actor reads time through `Clock` (now, sleep_until) bound to its event loop. On the real
loop that is the monotonic clock. `VirtualTimeLoop` is an asyncio loop whose clock only moves
when every task is blocked: its selector first polls real I/O (so ZMQ and sockets keep working),
and when nothing is ready it jumps straight to the next timer instead of sleeping. The real clock
actor, session actors and sockets then run unchanged, faster than real time, with exact timing:
a modelled 37 ms beat takes exactly 37 virtual ms.
"""
from __future__ import annotations

import asyncio
import selectors
import time

# The busy end of a blocking spin: a thread's sleep may overrun by the kernel's timer slack
# (50 µs by default), so the last stretch is a busy wait on the clock.
BLOCK_SPIN_S = 150e-6


class Clock:
    """Time as the running loop sees it (virtual on a VirtualTimeLoop), at full resolution.

    On a real loop `now` is the monotonic clock itself, not `loop.time()`: uvloop's is the same
    clock cut to whole milliseconds, which would round every stamped latency and could decide a
    deadline by the cut alone. Its timers are whole milliseconds too and may fire a little either
    side of the deadline, so `sleep_until` sleeps again when it woke early instead of starting a
    beat before its release."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self._loop = loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop or asyncio.get_running_loop()

    def now(self) -> float:
        loop = self.loop
        return loop.time() if isinstance(loop, VirtualTimeLoop) else time.monotonic()

    async def sleep_until(self, t: float, spin: float = 0.0, block: bool = False) -> None:
        """Return at t or just after. The last `spin` seconds pass yielding to the loop once per
        iteration instead of on a timer (a real loop only: virtual time stands still while any
        task is ready): the beat clock's release is then late by one iteration, not by up to a
        timer's rounding. With `block` they pass without yielding: asleep in the thread, then
        busy for the last `BLOCK_SPIN_S`, for a loop on which nothing else should run then
        (each yield of a spin costs a turn of the loop, and the turns add up to the spin)."""
        if isinstance(self.loop, VirtualTimeLoop):
            spin = 0.0
        while (delay := t - self.now()) > spin:
            await asyncio.sleep(delay - spin)
        if block:
            if (delay := t - time.monotonic() - BLOCK_SPIN_S) > 0:
                time.sleep(delay)
            while time.monotonic() < t:
                pass
            return
        while self.now() < t:
            await asyncio.sleep(0)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class _JumpingSelector(selectors.DefaultSelector):
    """Polls real I/O for at most `grace` real seconds; reports what it skipped as virtual time."""

    def __init__(self, grace: float):
        super().__init__()
        self.grace = grace
        self.jump = 0.0

    def select(self, timeout=None):
        if timeout is not None and timeout <= 0:
            return super().select(0)
        events = super().select(0 if timeout is None else min(timeout, self.grace))
        if events:
            return events
        if timeout is None:           # nothing scheduled: wait for real I/O
            return super().select(None)
        self.jump = timeout           # idle until the next timer: skip there
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time. `grace` is how long (real seconds) the loop waits for
    outside I/O before deciding it is idle; 0 for purely in-process runs (exact and fastest)."""

    def __init__(self, grace: float = 0.0, start: float = 0.0):
        self._selector_impl = _JumpingSelector(grace)
        super().__init__(self._selector_impl)
        self._virtual = start

    def time(self) -> float:
        sel = getattr(self, "_selector_impl", None)
        if sel is not None and sel.jump:
            self._virtual += sel.jump
            sel.jump = 0.0
        return self._virtual


def new_loop(virtual: bool = False, grace: float = 0.0, use_uvloop: bool = True):
    if virtual:
        return VirtualTimeLoop(grace)
    if use_uvloop:
        try:
            import uvloop
            return uvloop.new_event_loop()
        except ImportError:
            pass
    return asyncio.new_event_loop()


def wall() -> float:
    return time.monotonic()
