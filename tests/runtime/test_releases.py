"""A mass hang-up is released a few at a time, so the clock's loop stays free for its beats.

Bug it catches: every release of callers that hung up together ran in one turn of the event
loop (asyncio runs a turn's ready callbacks before it looks at I/O or timers again), so the
beat that finished meanwhile was routed tens of ms late and a drain beat ran late. Also: a
release that raises failing the others, an asker that gives up stopping the rest, a stopped
clock leaving askers waiting for ever.
"""
import asyncio

import pytest

from tests.nodekit import VirtualNode
from wave_actors.clock.releases import Releases


def test_releases_asked_together_run_a_few_a_loop_turn_in_order():
    done: list[int] = []
    seen: list[int] = []               # releases done, as a task that yields every turn saw

    async def go():
        pacer = Releases(lambda h: done.append(h) or h, per_turn=16)
        stop = asyncio.Event()

        async def probe():             # another task: the beat's completion, say
            while not stop.is_set():
                seen.append(len(done))
                await asyncio.sleep(0)
        watch = asyncio.create_task(probe())
        await asyncio.sleep(0)
        got = await asyncio.gather(*(pacer.release(i) for i in range(40)))
        stop.set()
        await watch
        return got, pacer.turns
    got, turns = asyncio.run(go())
    assert got == list(range(40)) and done == list(range(40))
    assert turns == 3
    steps = [b - a for a, b in zip(seen, seen[1:])]
    assert max(steps) <= 16 and sum(steps) == 40      # never more than one batch between


def test_a_failing_release_fails_its_asker_only_and_a_cancelled_one_stops_none():
    def release(h):
        if h == 3:
            raise RuntimeError("slot 3")
        return h

    async def go():
        pacer = Releases(release, per_turn=2)
        tasks = [asyncio.create_task(pacer.release(i)) for i in range(6)]
        await asyncio.sleep(0)
        tasks[4].cancel()                                # gives up before its turn
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return results
    results = asyncio.run(go())
    assert results[:3] == [0, 1, 2] and results[5] == 5
    assert isinstance(results[3], RuntimeError)
    assert isinstance(results[4], asyncio.CancelledError)


def test_a_stopped_pacer_leaves_no_asker_waiting():
    async def go():
        pacer = Releases(lambda h: h, per_turn=1)
        tasks = [asyncio.create_task(pacer.release(i)) for i in range(5)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        pacer.forget()
        return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 1.0)
    results = asyncio.run(go())
    assert results[0] == 0
    assert all(isinstance(r, asyncio.CancelledError) for r in results[2:])


def test_a_per_turn_below_one_is_refused():
    with pytest.raises(ValueError):
        Releases(lambda h: h, per_turn=0)


def test_a_node_hung_up_on_by_every_caller_frees_every_slot():
    vn = VirtualNode(max_sessions=40)
    try:
        async def go():
            calls = [await vn.client.open(f"s{i}", sample_rate=16000, format="pcm_f32le")
                     for i in range(40)]
            clock = vn.node.clock_actor
            assert len(clock.slots.table.entries) == 40
            stats = await asyncio.gather(*(c.close(timeout=10) for c in calls))
            assert all(s is not None for s in stats)
            assert not clock.slots.table.entries and clock.free_slots == 40
            assert clock.releases.turns >= 3            # 40 hang-ups: 16 a turn at most
        vn.run(go())
    finally:
        vn.close()
