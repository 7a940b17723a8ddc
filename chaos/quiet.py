"""How a fuzz round ends: the fuzzer listens for the last answers until the target has been
quiet a while, closes, and reports what came back and how long the round took."""
from __future__ import annotations

import asyncio
from typing import Callable


async def until_quiet(last_heard: Callable[[], float], settle_s: float, quiet_s: float,
                      step_s: float = 0.02) -> None:
    """Returns once nothing arrived for `quiet_s` (counted from now at the earliest: the last
    message just went out), or after `settle_s` at most."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while loop.time() - start < settle_s and loop.time() - max(last_heard(), start) < quiet_s:
        await asyncio.sleep(step_s)


async def fuzz_round(fz, count: int) -> dict:
    """`count` fuzz messages from `fz` (a zmq_fuzz or ws_fuzz Fuzzer, started), its last answers
    awaited, closed whatever happened: its report and the round's seconds."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        await fz.fuzz(count)
        await fz.settle()
    finally:
        await fz.close()
    return {**fz.report(), "elapsed_s": round(loop.time() - began, 2)}
