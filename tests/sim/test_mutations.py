"""The invariants' checks catch what they say: each bug below is planted in the real code (the
method monkeypatched with a buggy variant, one at a time) and the invariant's checking function,
called on the mutated code, fails. A check that still passed would be checking nothing.

Invariant 1's check is searched by hypothesis (it is cheap); the node's checks run on one input
of the kind their property tests generate, chosen to reach the bug.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings

from sim.executor import SimExecutor
from tests import nodekit
from tests.runtime import test_invariants_jitter as jit
from tests.sim import test_invariants as inv
from tests.sim import test_invariants_starts as inv_starts
from wave_actors.clock import slots as slots_module
from wave_actors.clock.clock import BeatClockActor
from wave_actors.core.frames import BEAT_S
from wave_actors.core.sched.jitter import CapacityError
from wave_actors.core.sched.jitter_arrays import ArrayScheduler
from wave_actors.core.prompt import fitted_prompt_tokens
from wave_actors.core.reorder import SkipLedger
from wave_actors.core.sched.session_table import SessionTable
from wave_actors.core.sched.start_shape import StartShape
from wave_actors.core.sched.start_policy import EagerStarts
from wave_actors.core.sched.start_queue import StartQueue
from wave_actors.sessions.session import SessionActor

# These check the checks, not the serving code: `make test` runs them, the edit loop does not.
pytestmark = pytest.mark.slow

FAILS = (AssertionError, BaseExceptionGroup)


def _search_jitter() -> None:
    """Invariant 1's property, searched afresh (no example database) on the mutated code."""
    @settings(max_examples=300, deadline=None, database=None)
    @given(jit.STEPS)
    def prop(run):
        jit.check_jitter_accounting(*run)
    with pytest.raises(FAILS):
        prop()


# -- 1. drops and underruns --------------------------------------------------------------------

def _drop_with_room(original):
    def push(self, slot, frame_no, pcm):
        if self.count[slot] >= self.max_queue - 2 and self.count[slot]:
            self.head[slot] = (self.head[slot] + 1) % self.max_queue
            self.count[slot] -= 1
            self.stats[slot, jit._col("dropped")] += 1
            self.totals.dropped += 1
        return original(self, slot, frame_no, pcm)
    return push


def _underrun_with_a_frame(original):
    def pack(self, inp, ready=None, gather=True):
        had = self.count.copy()
        plan = original(self, inp, ready, gather)
        s = plan.slot_idx[self.started[plan.slot_idx] & (had[plan.slot_idx] == 1)]
        self.stats[s, jit._col("underruns")] += 1        # the frame there counted missing too
        self.totals.underruns += len(s)
        return plan
    return pack


def _lowest_never_served(original):
    def pack(self, inp, ready=None, gather=True):
        held = np.flatnonzero(self.held).tolist()
        ready = set(held if ready is None else ready) - set(held[:1])
        return original(self, inp, ready, gather)
    return pack


@pytest.mark.parametrize("method,plant", [
    ("push", _drop_with_room),
    ("pack", _underrun_with_a_frame),                                     # the longest search
    ("pack", _lowest_never_served)],
    ids=["frame dropped with room left", "underrun counted with a frame queued",
         "lowest slot never served"])
def test_jitter_accounting_catches(monkeypatch, method, plant):
    monkeypatch.setattr(ArrayScheduler, method, plant(getattr(ArrayScheduler, method)))
    _search_jitter()


# -- 2. refusals -------------------------------------------------------------------------------

def test_refusals_catch_capacity_refused_with_a_slot_free(monkeypatch):
    admit = SessionTable.admit

    def refuses_the_last_slot(self, key, owner, prefer=None):
        if self.free_slots == 1:
            raise CapacityError("all slots are busy")
        return admit(self, key, owner, prefer)
    monkeypatch.setattr(SessionTable, "admit", refuses_the_last_slot)
    with pytest.raises(AssertionError, match="capacity with 1 slots free"):
        inv.check_refusals("eager", [("open", 0)] * inv.SLOTS_2)


def test_refusals_catch_admission_refused_though_the_policy_admits(monkeypatch):
    monkeypatch.setattr(slots_module, "admission",
                        lambda policy, live, starting, slots: "busy" if live else None)
    with pytest.raises(AssertionError, match="policy admitted"):
        inv.check_refusals("eager", [("open", 0), ("wait", 2), ("open", 0)])


def test_refusals_catch_a_start_given_up_after_one_beat(monkeypatch):
    """The issue's "start refused after 1 beat without room instead of 31", in today's design:
    an admitted session whose start (its prompt's rows) is given up after one beat instead of
    the node's start timeout, and refused `capacity` with its slot free again."""
    monkeypatch.setattr(nodekit, "NodeConfig",
                        functools.partial(nodekit.NodeConfig, start_timeout_s=BEAT_S))
    with pytest.raises(AssertionError, match="capacity with"):
        inv.check_refusals("eager", [("open", 300)])
    monkeypatch.undo()
    assert inv.check_refusals("eager", [("open", 300)]) == {}      # the case itself is fine


# -- 3. time to opened -------------------------------------------------------------------------

def test_open_bound_catches_rows_carried_every_other_beat(monkeypatch):
    beats = iter(range(10 ** 6))
    monkeypatch.setattr(EagerStarts, "carry_rows", lambda self, n, left: next(beats) % 2 == 0)
    with pytest.raises(AssertionError, match="bound"):
        inv.check_open_bounded([200])


def newest_first(self, rows):
    """StartQueue.plan serving the newest running starts first."""
    running = sorted(((s.order, slot) for slot, s in self._starts.items() if not s.done),
                     reverse=True)
    chosen = [slot for _, slot in running[:rows]]
    for slot in chosen:
        self._starts[slot].chunks += 1
    return chosen


def test_open_bound_catches_the_newest_start_served_first(monkeypatch):
    monkeypatch.setattr(StartQueue, "plan", newest_first)
    with pytest.raises(AssertionError, match="open 0 "):      # every start prefills its rows
        inv.check_open_bounded([480] * 20, snapshot_mb=0)


def test_open_bound_catches_a_start_never_given_rows(monkeypatch):
    plan = StartQueue.plan
    monkeypatch.setattr(StartQueue, "plan",
                        lambda self, rows: [s for s in plan(self, rows) if s != 0])
    with pytest.raises(AssertionError, match="open 0 "):
        inv.check_open_bounded([0, 100])


# -- 4. frame conservation ---------------------------------------------------------------------

def _release_loses_queued(original):
    def release(self, slot):
        self.count[slot] = 0                    # the queue forgotten before it is counted
        return original(self, slot)
    return release


def _held_not_counted(original):
    def flush_input(self):
        self._held.clear()
        return original(self)
    return flush_input


# Bursts that the node takes whole (no flood, no mailbox overflow): the frames lost at close are
# then the only drops.
QUIET_CASE = [(1, [(12, 2)]), (2, [(5, 1)])]


@pytest.mark.parametrize("cls,method,plant,case", [
    (SessionActor, "count_flooded", lambda original: lambda self, payload: None,
     inv.CONSERVATION_CASE),
    (ArrayScheduler, "release", _release_loses_queued, QUIET_CASE),
    (SessionActor, "flush_input", _held_not_counted, QUIET_CASE)],
    ids=["flood drop uncounted", "queued frames lost at release", "held frames lost at close"])
def test_conservation_catches_frames_lost_without_a_count(monkeypatch, cls, method, plant, case):
    monkeypatch.setattr(cls, method, plant(getattr(cls, method)))
    with pytest.raises(AssertionError, match="without a count"):
        inv.check_conservation(case)


def test_conservation_catches_a_skipped_seq_counted_again_when_it_comes(monkeypatch):
    """The session forgets what it counted a given-up seq as: its message, arriving after all
    (still in the mailbox while flood drops ahead of it held the reorder buffer past its
    bound), is counted lost a second time."""
    monkeypatch.setattr(SkipLedger, "take", lambda self, seq: None)
    with pytest.raises(AssertionError, match="counted twice"):
        inv.check_conservation(inv.REORDER_BOUND_CASE, once=True)


# -- 5. the same start decisions ---------------------------------------------------------------

def _fitted_short(self, spec):
    return fitted_prompt_tokens(self.text_codec, spec.instructions, spec.tools, 10 ** 6)[:300]


@pytest.mark.parametrize("name,value", [
    ("start_shape", StartShape(start_rows=2, small_rows=1)), ("prompt_tokens", _fitted_short)],
    ids=["sim cuts starts into fewer rows", "sim fits prompts differently"])
def test_same_starts_catches_the_sim_deciding_apart(monkeypatch, name, value):
    monkeypatch.setattr(SimExecutor, name, value)
    with pytest.raises(AssertionError):
        inv_starts.check_same_starts(inv_starts.STARTS_CASE)


# -- 6. the backlog drains ---------------------------------------------------------------------

def _schedule_rebased_on_late_beats(original):
    """Beats released a beat after the last late one ended, not on t0 + k · beat: the lateness
    an overload built up is never taken back."""
    async def _beat(self, k):
        recs = self.stats.records
        if recs and recs[-1].latency_s > BEAT_S and getattr(self, "_rebased", -1) != recs[-1].beat:
            self._rebased = recs[-1].beat
            self.t0 += recs[-1].latency_s - BEAT_S
        await original(self, k)
    return _beat


def test_backlog_check_catches_a_schedule_that_never_catches_up(monkeypatch):
    monkeypatch.setattr(BeatClockActor, "_beat",
                        _schedule_rebased_on_late_beats(BeatClockActor._beat))
    with pytest.raises(AssertionError, match="should have drained"):
        inv_starts.check_backlog_drains(4, 0.3, 0.08)
