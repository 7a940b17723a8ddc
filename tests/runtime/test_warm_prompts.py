"""The node's warm-up (`wave_actors/node/warm.py`): prompts started before the socket is read,
so their first callers start by a snapshot copy; nothing of the warm-up is heard or counted as
a call, and a prompt the node cannot take stops its start with the reason."""
from __future__ import annotations

import asyncio

import pytest

from tests.nodekit import VirtualNode
from wave_actors.core.contract import ExecutorOptions, SessionSpec
from wave_actors.core.frames import BEAT_S
from wave_actors.core.sched.slot_book import SlotBook
from wave_actors.core.sched.start_policy import GuardedStarts
from wave_actors.core.sched.start_shape import StartShape
from wave_actors.core.timebase import Clock, VirtualTimeLoop
from wave_actors.node.config import NodeConfig
from wave_actors.node.node import Node
from wave_actors.node.warm import WarmFailed
from sim.executor import SimExecutor

AGENT = "You are the booking line of a small hotel. Be brief."


def recording(vn: VirtualNode) -> list:
    """Every plan the node's clock makes from now on."""
    book, plans = vn.node.clock_actor.slots.book, []
    plan = book.plan

    def recorded(time_left_s):
        plans.append(plan(time_left_s))
        return plans[-1]
    book.plan = recorded
    return plans


def test_a_warmed_prompts_first_caller_starts_by_one_copy():
    """Catches a warm-up that releases its session before the snapshot is saved, saves nothing,
    or keys it apart from a caller's identical prompt: the first caller would prefill."""
    vn = VirtualNode(4, warm_prompts=(SessionSpec(), SessionSpec(AGENT)))
    try:
        stats = vn.node.clock_actor.snapshot_stats
        assert stats["saves"] == 2 and stats["kept"] == 2 and stats["hits"] == 0
        assert vn.node.warmed.ready == 2 and vn.node.warmed.timed_out == 0
        plans = recording(vn)

        async def call():
            s = await vn.client.open("first", instructions=AGENT, timeout=10.0)
            await vn.clock.sleep(2 * BEAT_S)     # past its start: `opened` came before it
            await s.close()
        vn.run(call())
        assert vn.node.clock_actor.snapshot_stats["hits"] == 1
        assert not any(p.rows for p in plans), "the warmed prompt was prefilled again"
        assert [len(p.copies) for p in plans if p.copies] == [1]
    finally:
        vn.close()


def test_the_warm_up_is_heard_by_nobody_and_counted_as_no_call():
    """Catches a warm-up session that runs frames (its rows routed to no one: an unroutable
    count, or a crash of the clock), counts as an opened call, or keeps its slot."""
    vn = VirtualNode(2, warm_prompts=(SessionSpec(AGENT),))
    try:
        vn.settle(1.0)                                   # beats run on after the warm-up
        node, clock = vn.node, vn.node.clock_actor
        assert node.counters.opened == 0 and node.counters.closed == 0
        assert clock.stats.unroutable == 0 and clock.jitter_totals.underruns == 0
        assert clock.free_slots == 2 and clock.slots.book.occupancy() == (0, 0)
        assert node.describe()["warm_prompts"]["ready"] == 1
        saves = node.metrics.registry.get_sample_value("wave_snapshot_saves_total")
        assert saves == 1
    finally:
        vn.close()


def test_a_warm_prompt_the_node_cannot_take_stops_its_start_with_the_reason():
    """Catches a node that serves on without the prompt it was told to warm, or that leaves
    its socket bound and its clock running after refusing to start."""
    loop = VirtualTimeLoop()
    asyncio.set_event_loop(loop)
    clock = Clock(loop)
    executor = SimExecutor(ExecutorOptions(max_sessions=2), clock=clock)
    node = Node(NodeConfig(bind="inproc://warm-refused", max_sessions=2,
                           warm_prompts=(SessionSpec("x" * 3000),)), executor, clock)
    try:
        with pytest.raises(WarmFailed, match=r"warm prompt 1 .*3002 prompt tokens"):
            loop.run_until_complete(node.start())
        assert node.stopped.is_set() and node.sock.closed
    finally:
        executor.close()
        node.ctx.destroy(linger=0)
        loop.close()
        asyncio.set_event_loop(None)


def test_no_warm_up_where_the_executor_keeps_no_snapshots():
    """A prompt started where nothing keeps it would cost beats for nothing."""
    vn = VirtualNode(2, snapshot_mb=0, warm_prompts=(SessionSpec(AGENT),))
    try:
        assert vn.node.warmed is None and vn.node.clock_actor.snapshot_stats is None
        assert "warm_prompts" not in vn.node.describe()
    finally:
        vn.close()


def test_admission_does_not_weigh_a_session_released_before_the_next_plan():
    """Catches the phantom the warm-up exposed: its session, released at once, stays live in
    the book until the next plan, and an admission test that weighed it refused every caller
    of a node whose lone-session beat is slow (the bench then waited forever)."""
    book = SlotBook(4, StartShape(), GuardedStarts(), 1500, 188)
    book.open(0, [1, 2])
    book.plan(0.16)
    assert book.ready(0) and book.occupancy() == (1, 0)
    assert book.occupancy([("close", 0)]) == (0, 0)
    book.open(1, [1, 2])
    assert book.occupancy([("close", 0), ("close", 0)]) == (0, 1)   # one session, named twice


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_node_with_session_workers_warms_in_its_engine_process():
    """The same warm-up through the clock's proxy: the engine's clock makes the snapshot and
    reports it, and a caller with the prompt starts by a copy there too."""
    from tests.tcpkit import client_of, node_on_tcp

    async def body():
        async with node_on_tcp(2, workers=1, warm_prompts=(SessionSpec(AGENT),)) as node:
            assert node.warmed.ready == 1
            async with client_of(node) as c:
                s = await c.open("first", instructions=AGENT, timeout=10.0)
                await asyncio.sleep(0.5)                  # a beat report or three
                stats = node.clock_actor.snapshot_stats
                await s.close()
            assert stats["saves"] == 1 and stats["hits"] == 1 and stats["misses"] == 1
    asyncio.run(body())


def test_a_restarted_clock_warms_the_prompts_again():
    """Catches a node whose snapshots went with a crashed clock for good: every prompt's next
    caller would prefill it again."""
    from wave_actors.clock.clock import _Crash
    vn = VirtualNode(2, warm_prompts=(SessionSpec(AGENT),))
    try:
        old = vn.node.clock_actor
        old.tell(_Crash(RuntimeError("a fault in the clock")))
        vn.settle(1.0)
        clock = vn.node.clock_actor
        assert clock is not old and clock.snapshot_stats["saves"] == 1
        assert clock.slots.book.occupancy() == (0, 0) and clock.free_slots == 2
    finally:
        vn.close()
