"""`within` and `stop_tasks`: a cancel that arrives in the same loop step as the awaited result
is not lost (the bug: Python 3.11's `asyncio.wait_for` returned the result instead, so a feed
loop cancelled by its connection ran on and the bridge's shutdown waited for it forever)."""
import asyncio

import pytest

from wave_actors.core.tasks import stop_tasks, within


def race_cancel_with_result(wait) -> tuple[int, bool]:
    """A loop awaiting futures through `wait`; the test completes one future and cancels the
    loop in the same step. Returns (futures awaited, whether the loop ended)."""
    async def go():
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future] = []

        async def looper():
            while True:
                fut = loop.create_future()
                futures.append(fut)
                await wait(fut, 5)

        task = asyncio.create_task(looper())
        await asyncio.sleep(0)
        futures[-1].set_result(1)          # the awaited thing finishes...
        task.cancel()                      # ...in the step the cancel arrives
        await asyncio.wait({task}, timeout=0.5)
        ended = task.done()
        task.cancel()
        await asyncio.wait({task}, timeout=0.5)
        return len(futures), ended
    return asyncio.run(go())


def test_within_keeps_a_cancel_that_races_the_result():
    awaited, ended = race_cancel_with_result(within)
    assert ended and awaited == 1


def test_within_times_out_and_returns_results():
    async def go():
        assert await within(asyncio.sleep(0, "x"), 1) == "x"
        assert await within(asyncio.sleep(0, "y"), None) == "y"
        with pytest.raises(asyncio.TimeoutError):
            await within(asyncio.sleep(5), 0.01)
    asyncio.run(go())


def test_stop_tasks_ends_a_task_that_swallows_a_cancel():
    """A task that survives its first cancel (as a loop around 3.11's wait_for could) is
    cancelled again until it ends; one that never ends is handed back after the patience."""
    async def go():
        seen, limit = [], {"once": 1, "never": 10 ** 9}

        async def stubborn(name: str):
            swallowed = 0
            while True:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    seen.append(name)
                    swallowed += 1
                    if swallowed > limit[name]:
                        raise

        async def fails():
            raise ValueError("consumed, not logged as never retrieved")

        once, never = asyncio.create_task(stubborn("once")), asyncio.create_task(stubborn("never"))
        failing = asyncio.create_task(fails())
        await asyncio.sleep(0)
        left = await stop_tasks([once, failing, None], patience_s=1.0)
        assert left == [] and once.cancelled() and seen.count("once") == 2
        left = await stop_tasks([never], patience_s=0.2)
        assert left == [never] and not never.done() and seen.count("never") >= 2
        limit["never"] = 0                  # its next cancel ends it
        assert await stop_tasks([never]) == [] and never.cancelled()
    asyncio.run(go())
