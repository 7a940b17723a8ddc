"""A late wake of the beat clock names the work that held the loop.

Bugs these catch: sampling the watcher's own thread instead of the loop's (the stack would name
`_sample`, not the hog); a watch that samples on-time wakes (a stall recorded without a late
release); a watch never disarmed (every later beat a stall); the clock not arming it on a real
loop, or arming it on virtual time (where nothing can stall)."""
from __future__ import annotations

import pytest
import asyncio
import time

from sim.costmodel import CostModel
from sim.executor import SimExecutor
from wave_actors.core.contract import ExecutorOptions
from wave_actors.core.frames import BEAT_S
from wave_actors.core.timebase import Clock, new_loop
from wave_actors.runtime.loop_stalls import StallWatch, stack_of
from wave_actors.node.config import NodeConfig
from wave_actors.node.node import Node


def _hog_the_loop(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:       # Python work on the loop's thread, as a session's would be
        sum(range(200))


async def _wake_at(watch: StallWatch, release: float) -> float:
    watch.expect(release)
    await asyncio.sleep(max(0.0, release - time.monotonic()))
    watch.woke()
    return time.monotonic() - release


def test_a_late_wake_is_sampled_with_the_blocking_function_on_top():
    async def main():
        watch = StallWatch(after_s=0.002, every_s=0.001).start()
        try:
            release = time.monotonic() + 0.01
            waiter = asyncio.create_task(_wake_at(watch, release))
            await asyncio.sleep(0)                          # the waiter armed and asleep
            _hog_the_loop(0.06)                             # across the release
            late = await waiter
            await asyncio.sleep(0.01)                       # the watcher files the stall
            return watch, late
        finally:
            watch.stop()

    watch, late = asyncio.run(main())
    assert late > 0.04
    assert len(watch.stalls) == 1
    stall = watch.stalls[0]
    assert abs(stall.late_s - late) < 0.005
    assert stall.samples >= 3        # one a GIL switch interval at least (5 ms by default)
    top_frames = stall.stacks[0][1]
    assert "_hog_the_loop" in top_frames[0] or "_hog_the_loop" in top_frames[1]
    assert stall.describe()["late_ms"] > 40


def test_on_time_wakes_leave_no_stall():
    """Every stall filed is a wake that really was late past `after_s` (a busy machine may make
    one late: that one is a stall, not a false report)."""
    after_s = 0.003

    async def main():
        watch = StallWatch(after_s=after_s).start()
        lates = []
        try:
            for _ in range(20):
                lates.append(await _wake_at(watch, time.monotonic() + 0.005))
            await asyncio.sleep(0.01)
            return watch, lates
        finally:
            watch.stop()

    watch, lates = asyncio.run(main())
    late_wakes = sum(late > after_s for late in lates)
    assert len(watch.stalls) <= late_wakes
    assert all(stall.late_s > after_s for stall in watch.stalls)


def test_stack_of_names_innermost_first():
    def inner():
        import sys
        return stack_of(sys._getframe())

    frames = inner()
    assert frames[0].endswith(" inner")
    assert "test_stack_of_names_innermost_first" in frames[1]
    assert frames[0].startswith("runtime/test_loop_stalls.py:")


@pytest.mark.slow
def test_the_beat_clock_on_a_real_loop_records_what_held_it():
    """A node on a real loop: work that holds the loop across a release shows in the clock's
    stalls by name; on time again afterwards, no more stalls."""
    loop = new_loop(use_uvloop=False)
    asyncio.set_event_loop(loop)
    clock = Clock(loop)
    executor = SimExecutor(ExecutorOptions(max_sessions=2), CostModel.load(), clock)
    node = Node(NodeConfig(bind="inproc://stall-node", max_sessions=2), executor, clock)

    async def main():
        await node.start()
        try:
            await asyncio.sleep(2 * BEAT_S)
            _hog_the_loop(1.5 * BEAT_S)             # covers at least one release
            await asyncio.sleep(0.02)
            held = list(node.clock_actor.stalls.stalls)
            await asyncio.sleep(4 * BEAT_S)         # on time again
            return held, list(node.clock_actor.stalls.stalls)
        finally:
            await node.drain()

    try:
        held, after = loop.run_until_complete(main())
    finally:
        loop.close()
        asyncio.set_event_loop(None)
    assert held, "a release passed while the loop was held, and no stall was recorded"
    assert any("_hog_the_loop" in " ".join(f for _, st in s.stacks for f in st) for s in held)
    assert after == held


def test_virtual_time_never_starts_the_watch():
    from tests.nodekit import VirtualNode
    vn = VirtualNode(max_sessions=1)
    try:
        vn.settle(1.0)
        assert vn.node.clock_actor.stalls._thread is None
    finally:
        vn.close()
