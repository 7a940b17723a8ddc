"""The clock's one slot owner (`clock/slots.py`): changes asked between beats reach the book at
the next boundary, in order; openers learn when their start is done or gone."""
import asyncio

import pytest

from sim.costmodel import CostModel
from sim.executor import SimExecutor
from wave_actors.clock.slots import Slots
from wave_actors.core.contract import ExecutorOptions
from wave_actors.core.sched.clock_policy import ClockPolicy
from wave_actors.core.sched.jitter import AdmissionRefused
from wave_actors.core.sched.start_policy import EagerStarts, GuardedStarts


def slots_for(n: int) -> Slots:
    sim = SimExecutor(ExecutorOptions(max_sessions=n), CostModel.load())
    return Slots(sim, 0, ClockPolicy(), EagerStarts())


def run(fn):
    return asyncio.run(fn())


def test_a_start_is_ready_after_its_rows_and_a_released_one_is_told_false():
    async def go():
        slots = slots_for(2)
        prompt = list(range(3, 3 + 40))                # three chunks of rows
        a = slots.admit("a", None, prompt, None)
        b = slots.admit("b", None, prompt, None)
        ready_a, ready_b = slots.when_ready(a), slots.when_ready(b)
        assert slots.release(b) is not None and ready_b.result() is False
        assert slots.release(b) is None                # stale: counted, no second close
        for _ in range(20):
            plan = slots.plan(1.0)
            assert b.slot not in {s for s, _, _ in plan.rows}   # its open never applied
            slots.book.observe(plan, 0.0)
            if ready_a.done():
                break
        assert ready_a.result() is True and slots.free == 1
    run(go)


@pytest.mark.parametrize("old_chunks,beats", [(5, 2), (3, 1)])
def test_a_slot_released_mid_start_and_taken_again_in_one_gap_starts_fresh(old_chunks, beats):
    """A release and a new admission of the same slot between two beats: the book skips the old
    session's close (the slot is held again) and opens the new one. The bug this guards: the
    old start's progress carried over, so the new session skips its first chunks or goes live
    before its own prompt has run."""
    async def go():
        slots = slots_for(1)
        old = slots.admit("old", None, list(range(3, 3 + 16 * old_chunks)), None)
        for _ in range(beats):                         # the old start is under way (or done)
            slots.book.observe(slots.plan(1.0), 0.0)
        assert not slots.book.ready(old.slot)
        slots.release(old)
        new_prompt = list(range(100, 100 + 80))
        new = slots.admit("new", None, new_prompt, None)
        assert new.slot == old.slot
        ready, heard = slots.when_ready(new), []
        for _ in range(20):
            plan = slots.plan(1.0)
            heard += [chunk for slot, chunk, _ in plan.rows if slot == new.slot]
            assert not (slots.book.ready(new.slot) and len(heard) < 5), "live before its prompt"
            slots.book.observe(plan, 0.0)
            if ready.done():
                break
        assert ready.result() is True
        assert [t for chunk in heard for t in chunk] == new_prompt   # all of it, in order
    run(go)


def test_opens_of_one_gap_are_weighed_together():
    """A burst of opens between two beats is judged as the book will hold it at the next plan.
    The bug this guards: each open weighed against the book of the last plan (none of the
    burst counted as starting), so a node with more slots than its beat carries on time
    admitted the whole burst at once and every live call heard late beats."""
    async def go():
        slots = Slots(SimExecutor(ExecutorOptions(max_sessions=8), CostModel.load()), 0,
                      ClockPolicy(), GuardedStarts())
        # a beat of n sessions forecast at 10 + 40 (n - 1) ms: four fit the 160 ms beat
        slots.book.policy.know_beats({1: 0.010, 8: 0.290})
        admitted = []
        for i in range(8):
            try:
                admitted.append(slots.admit(i, None, [3, 4, 5], None))
            except AdmissionRefused:
                pass
        assert len(admitted) == 4
        slots.release(admitted[0])                 # a close in the same gap frees its weight
        assert slots.admit("late", None, [3, 4, 5], None) is not None
        with pytest.raises(AdmissionRefused):
            slots.admit("one more", None, [3, 4, 5], None)
    run(go)
