"""Waiting with a deadline and stopping tasks, without losing a cancellation.

`asyncio.wait_for` before Python 3.12 returns the awaited result, and drops the cancellation,
when the awaited thing finishes in the same loop step as the cancel. A loop around it (a feed
that sends a frame every tick) then runs on after its owner cancelled it, and the owner's
`gather` waits for it forever. `within` is the deadline that keeps the cancel; `stop_tasks`
cancels until each task has really ended.
"""
from __future__ import annotations

import asyncio
import logging
import sys
from typing import Awaitable, Iterable, TypeVar

T = TypeVar("T")
log = logging.getLogger("wave.tasks")


async def within(aw: Awaitable[T], timeout_s: float | None) -> T:
    """`await aw`, raising `asyncio.TimeoutError` past `timeout_s` (None: no deadline). A cancel
    of the caller always propagates, whatever `aw` did in the same step."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout_s):
            return await aw
    return await asyncio.wait_for(aw, timeout_s)    # pragma: no cover - Python 3.10


async def stop_tasks(tasks: Iterable[asyncio.Task | None], patience_s: float = 5.0,
                     every_s: float = 0.05) -> list[asyncio.Task]:
    """Cancel `tasks` and wait until they have ended, cancelling again any that swallowed a
    cancel. Their results and exceptions are consumed (an owner stopping them does not want
    them). Returns the tasks still running after `patience_s` (an empty list normally)."""
    tasks = [t for t in tasks if t is not None]
    pending = {t for t in tasks if not t.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience_s
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=every_s)
        if loop.time() >= deadline:
            break
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()
    if pending:
        log.warning("%d task(s) still running %.1f s after being cancelled: %s", len(pending),
                    patience_s, ", ".join(sorted(t.get_name() for t in pending)))
    return list(pending)
