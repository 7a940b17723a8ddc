"""The session table (slot, generation) and what it guards: nothing stale touches a reused slot.

The scenario the table exists for, on virtual time with the real node: session A opens with a
long prompt, the clock crashes while A is starting, B opens and gets slot 0; A's orphaned open
must neither free B's slot nor leave A's start behind in the new clock's book. And a supervisor
that gives up on the clock drains the node, which says why it failed."""
import asyncio

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.nodekit import VirtualNode
from transports.client import Audio, Closed, Refused
from wave_actors.clock.clock import _Crash
from wave_actors.core.frames import BEAT_S
from wave_actors.core.sched.session_table import CapacityError, SessionTable

LONG_PROMPT = "Speak slowly and clearly, and never interrupt the caller. " * 7   # ~26 start rows


def test_a_stale_handle_is_rejected_counted_and_frees_nothing():
    table = SessionTable(2)
    a = table.admit("a", None)
    assert table.release(a) is not None
    b = table.admit("b", None)
    assert b.slot == a.slot and b.generation != a.generation
    assert table.release(a) is None and table.stale == 1           # A's second release
    assert not table.push(a, 0, np.zeros(1280, np.float32)) and table.stale == 2
    assert table.current(b) is not None and table.free_slots == 1


def test_generations_never_repeat_across_clock_incarnations():
    """A handle of an earlier incarnation (epoch) is stale in the next one, even for the same
    slot and the same count of admissions."""
    first, second = SessionTable(1, epoch=1), SessionTable(1, epoch=2)
    a, b = first.admit("a", None), second.admit("b", None)
    assert a.slot == b.slot and a != b
    assert second.release(a) is None and second.current(b) is not None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "release", "release-stale"]),
                          st.integers(0, 5)), max_size=60))
def test_only_the_current_handle_of_a_slot_frees_it(ops):
    """Bug it catches: a release keyed by slot number alone (the old `Release(slot)`), which
    frees whichever session holds the slot now."""
    table, held, old = SessionTable(3), {}, []
    for kind, k in ops:
        if kind == "admit":
            try:
                h = table.admit(k, None)
            except CapacityError:
                assert len(held) == 3
                continue
            held[h.slot] = h
        elif kind == "release" and held:
            h = held.pop(sorted(held)[k % len(held)])
            assert table.release(h) is not None
            old.append(h)
        elif kind == "release-stale" and old:
            assert table.release(old[k % len(old)]) is None
        assert {e.handle for e in table.entries.values()} == set(held.values())
        assert table.free_slots == 3 - len(held)


def test_a_start_orphaned_by_a_clock_crash_cannot_touch_the_next_session():
    vn = VirtualNode(1)
    try:
        node = vn.node

        async def scenario():
            a_open = asyncio.ensure_future(vn.client.open("a", sample_rate=16000,
                                                          format="pcm_f32le",
                                                          instructions=LONG_PROMPT))
            await vn.clock.sleep(4 * BEAT_S)
            old = node.clock_actor
            (a_handle,) = [e.handle for e in old.slots.table.entries.values()]
            assert not old.slots.book.ready(a_handle.slot)               # A is still starting
            old.tell(_Crash(RuntimeError("a fault in the clock")))
            with pytest.raises(Refused) as refused:                # A hears at once
                await asyncio.wait_for(a_open, 2.0)
            assert "restarted" in refused.value.message
            clock = node.clock_actor
            assert clock is not old and not clock.slots.book.starts._starts   # nothing of A carried
            b = await vn.client.open("b", sample_rate=16000, format="pcm_f32le")
            assert b.opened["slot"] == a_handle.slot
            b_handle = node.routes[(vn.client.identity, "b")].handle
            # A's open, had it lingered, would release its handle now: stale, counted, harmless
            stale = node.counters.stale
            assert await node.free_slot(a_handle) is None
            assert node.counters.stale == stale + 1 and clock.slots.table.stale >= 1
            assert clock.slots.table.current(b_handle) is not None and clock.free_slots == 0
            frames = 0
            for _ in range(400):                                   # > 60 s of B's call
                await b.send_audio(np.zeros(1280, np.float32).tobytes())
                await vn.clock.sleep(0.08)
            while not b.events.empty():
                frames += isinstance(b.events.get_nowait(), Audio)
            assert frames > 300 and (vn.client.identity, "b") in node.sessions
            closed = await b.close()
            assert isinstance(closed, Closed) and closed.stats["frames_in"] > 300
        vn.run(scenario())
    finally:
        vn.close()


def test_a_supervisor_that_gives_up_drains_the_node_and_says_why():
    vn = VirtualNode(2)
    try:
        node = vn.node

        async def scenario():
            s = await vn.client.open("s", sample_rate=16000, format="pcm_f32le")
            for _ in range(node.supervisor.max_restarts + 1):
                node.clock_actor.tell(_Crash(RuntimeError("a fault in the clock")))
                await vn.clock.sleep(BEAT_S)
            await asyncio.wait_for(node.stopped.wait(), 10.0)
            assert node.failed and "restarts" in node.failed
            assert node.draining and not node.sessions
            return s
        vn.run(scenario())
    finally:
        vn.close()


def test_a_batch_of_frames_queues_only_current_handles_frames_in_order():
    """`push_batch` checks handles as arrays. Catches: a released slot's (stale) frames queued
    into its next session; a slot number off the table crashing the clock instead of being
    counted; frames of one slot queued out of their order in the batch."""
    table = SessionTable(4, prebuffer=1)
    a, b, c = (table.admit(("k", i), None) for i in range(3))
    table.release(b)
    b2 = table.admit(("k", 9), None)                 # b's slot again, a new generation
    assert b2.slot == b.slot and b2.generation != b.generation
    rows = [(a, 0), (b, 0), (b2, 0), (a, 1), (c, 0), (b2, 1)]
    slots = np.array([h.slot for h, _ in rows] + [7, -1], np.int32)
    gens = np.array([h.generation for h, _ in rows] + [1, 1], np.int64)
    nos = np.array([n for _, n in rows] + [0, 0], np.int64)
    pcm = np.arange(len(slots), dtype=np.float32)[:, None] * np.ones((1, 1280), np.float32)
    refused = table.push_batch(slots, gens, nos, pcm)
    assert refused == 3 and table.stale == 3          # b's frame and the two off the table
    queued = {h.slot: list(zip(table.jitter.queued(h.slot),
                               table.jitter.queued_pcm(h.slot)[:, 0].tolist()))
              for h in (a, b2, c)}
    assert queued == {a.slot: [(0, 0.0), (1, 3.0)], b2.slot: [(0, 2.0), (1, 5.0)],
                      c.slot: [(0, 4.0)]}
