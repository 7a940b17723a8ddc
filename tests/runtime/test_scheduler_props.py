"""Property tests of the pure beat scheduler (no clock, no sockets).

Invariants, for every slot and at every step:
  - live sessions never exceed the slots, and free + live == slots;
  - no starvation: every admitted slot is in every beat, with its two frames;
  - a frame is dropped on arrival only when the buffer is full (one for one);
  - the frame numbers handed to the backend are strictly increasing;
  - every pushed frame is handed over exactly once, or counted dropped (shed included), or
    still queued;
  - silence is counted as an underrun only after the slot started; before, as idle.
"""
import numpy as np
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule,
                                 run_state_machine_as_test)

from wave_actors.core.contract import BeatInput
from wave_actors.core.frames import BEAT_S
from wave_actors.core.sched.jitter import SILENCE, BeatScheduler, CapacityError, Shedding

SLOTS = 4


class SchedulerMachine(RuleBasedStateMachine):
    SHEDDING: Shedding | None = None        # the fixed buffer

    def __init__(self):
        super().__init__()
        self.s = BeatScheduler(SLOTS, prebuffer=3, max_queue=6, shedding=self.SHEDDING)
        self.inp = BeatInput.alloc(SLOTS)
        self.pushed = {}        # slot -> frame numbers pushed
        self.handed = {}        # slot -> frame numbers the backend got
        self.next_key = 0
        self.closed_ok = 0

    @rule()
    def admit(self):
        try:
            slot = self.s.admit(self.next_key)
        except CapacityError:
            assert len(self.s.slots) == SLOTS
            return
        self.next_key += 1
        self.pushed[slot], self.handed[slot] = [], []

    @precondition(lambda self: self.s.slots)
    @rule(data=st.data(), n=st.integers(1, 5))
    def push(self, data, n):
        slot = data.draw(st.sampled_from(sorted(self.s.slots)))
        for _ in range(n):
            f = len(self.pushed[slot])
            sl = self.s.slots[slot]
            full, dropped = len(sl.jitter) >= self.s.max_queue, sl.stats.dropped
            self.s.push(slot, f, np.full(1280, f + 1, np.float32))
            self.pushed[slot].append(f)
            assert sl.stats.dropped == dropped + full, \
                "a frame dropped with room in the buffer, or none dropped when it was full"

    @rule(late=st.booleans())
    def beat(self, late):
        live = set(self.s.slots)
        plan = self.s.pack(self.inp)
        assert set(plan.slots) == live, f"slots {sorted(live - set(plan.slots))} not served"
        assert all(len(plan.frames[slot]) == 2 for slot in live)
        for slot in plan.slots:
            for i, f in enumerate(plan.frames[slot]):
                # the audio packed is the frame's own (value f+1), or silence
                assert self.inp.audio[slot, i, 0] == (0.0 if f == SILENCE else f + 1)
                if f != SILENCE:
                    self.handed[slot].append(f)
        routed = self.s.complete(plan, late)
        assert set(routed) == set(plan.slots)

    @precondition(lambda self: self.s.slots)
    @rule(data=st.data())
    def release(self, data):
        slot = data.draw(st.sampled_from(sorted(self.s.slots)))
        stats = self.s.release(slot)
        pushed, handed = self.pushed.pop(slot), self.handed.pop(slot)
        assert stats.frames_in == len(handed)
        assert stats.frames_in + stats.dropped == len(pushed)      # nothing vanished
        assert 0 <= stats.shed <= stats.dropped

    @invariant()
    def slots_bounded(self):
        assert len(self.s.slots) <= SLOTS and self.s.free_slots + len(self.s.slots) == SLOTS

    @invariant()
    def frames_exactly_once_in_order(self):
        for slot, sl in self.s.slots.items():
            handed = self.handed[slot]
            assert handed == sorted(set(handed))                    # strictly increasing
            queued = [f for f, _ in sl.jitter]
            assert not set(queued) & set(handed)
            assert len(handed) + sl.stats.dropped + len(queued) == len(self.pushed[slot])
            if not sl.started:
                assert sl.stats.underruns == 0


    @invariant()
    def totals_add_up(self):
        assert self.s.totals.shed <= self.s.totals.dropped
        if self.SHEDDING is None:
            assert self.s.totals.shed == 0


class SheddingMachine(SchedulerMachine):
    """The same invariants while shedding: a window of two beats and no reserve, so a slot pushed
    ahead sheds within a few steps."""
    SHEDDING = Shedding(window_s=2 * BEAT_S, keep=0, per_beat=2)


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
# the edit loop keeps the machine without shedding; make test runs this one too
TestSchedulerShedding = pytest.mark.slow(SheddingMachine.TestCase)
TestSchedulerShedding.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


# -- the tests above catch what they say: bugs planted one at a time --------------------------

def _starve_lowest(original):
    def pack(self, inp, ready=None):
        lowest = min(self.slots) if self.slots else None
        return original(self, inp, None if lowest is None else set(self.slots) - {lowest})
    return pack


def _drop_early(original):
    def push(self, slot, frame_no, pcm):
        s = self.slots[slot]
        if len(s.jitter) >= self.max_queue - 2 and s.jitter:
            s.jitter.popleft()
            s.stats.dropped += 1
            self.totals.dropped += 1
        return original(self, slot, frame_no, pcm)
    return push


# A check of the property tests themselves (a search per planted bug): `make test` runs it.
@pytest.mark.slow
@pytest.mark.parametrize("method,plant", [("pack", _starve_lowest), ("push", _drop_early)],
                         ids=["lowest slot never served", "frame dropped with room left"])
def test_planted_bugs_are_caught(monkeypatch, method, plant):
    """Each bug, planted in the scheduler, fails the state machine above."""
    monkeypatch.setattr(BeatScheduler, method, plant(getattr(BeatScheduler, method)))
    with pytest.raises(AssertionError):
        run_state_machine_as_test(SchedulerMachine, settings=settings(
            max_examples=200, stateful_step_count=40, deadline=None, database=None))
