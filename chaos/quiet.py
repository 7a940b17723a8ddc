"""How a fuzzer listens for the last answers: until the target has been quiet a while."""
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
