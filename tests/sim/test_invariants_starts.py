"""Invariants 5 and 6 of the node on virtual time (see `test_invariants.py` for 2 to 4), each
with a checking function that `test_mutations.py` calls on planted bugs:

  5. the sim and another executor make the same start decisions when fed the same measured beat
     times: the slot book and start policy decide, never the executor (`check_same_starts`);
  6. a backlog drains once load falls: after N beats costing c_hi > 160 ms, beats costing
     c_lo < 160 ms are back on the drift-free schedule within ceil(N (c_hi - 160 ms) /
     (160 ms - c_lo)) beats (`check_backlog_drains`).
"""
from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from tests.nodekit import VirtualNode, slow_cost
from tests.sim.invariant_kit import EPS, open_one, scripted, tmp_dir
from transports.client import Refused
from wave_actors.core.frames import BEAT_S
from wave_actors.core.sched.start_policy import BudgetedStarts


# -- 5. the sim and another executor decide starts alike --------------------------------------

SLOTS_5 = 6
# (beat it comes at, prompt characters, beats it stays open after it is answered)


def run_starts(make_executor, opens: list, beats: int = 40,
               snapshot_mb: float = -1.0) -> tuple[list, list, list, int]:
    """Runs `opens` on a node with the budgeted start policy (its decisions hang on the
    measured beats) and sessions of 45 ms a beat (four live overrun); returns every beat's
    start decisions, the measured beat times, when and where each open was answered, and the
    beats whose rows the policy held back. `snapshot_mb`: the executors' prompt snapshots."""
    kw = {} if make_executor is None else {"executor": make_executor}
    vn = VirtualNode(SLOTS_5, slow_cost(tmp_dir(), 45.0), start_policy=BudgetedStarts(),
                     snapshot_mb=snapshot_mb, **kw)
    clock = vn.node.clock_actor
    decisions, plan = [], clock.slots.book.plan

    def recorded(time_left_s):
        p = plan(time_left_s)
        decisions.append((p.beat, tuple(p.resets), tuple(p.live),
                          tuple((slot, at) for slot, _chunk, at in p.rows), tuple(p.started),
                          tuple(p.copies), tuple(p.saves)))
        return p
    clock.slots.book.plan = recorded

    async def one(i, at, chars, stay):
        await asyncio.sleep(at * BEAT_S + 0.01 + 0.002 * i)     # in a set order
        t, answer = await open_one(vn, f"s{i}", chars)
        if isinstance(answer, Refused):
            return (i, round(t, 9), answer.reason)
        # off the beat's instants and in a set order, as the opens: two closes at the instant
        # a beat is planned race it, and which one the plan sees is the loop's choice
        await asyncio.sleep(stay * BEAT_S + 0.003 + 0.002 * i)
        await answer.close()
        return (i, round(t, 9), answer.opened["slot"])

    async def workload():
        answers = await asyncio.gather(*[one(i, *o) for i, o in enumerate(opens)])
        await asyncio.sleep(max(0.0, beats * BEAT_S - vn.clock.now()))
        return answers

    try:
        answered = vn.run(workload())
        times = [r.compute_s for r in clock.stats.records]
        return decisions, times, answered, clock.slots.book.policy.held_back
    finally:
        vn.close()


def check_same_starts(opens: list, snapshot_mb: float = -1.0) -> int:
    """The sim's run, then a scripted executor's fed the sim's measured beat times: the same
    start decisions (rows, snapshot copies and saves) beat by beat and the same answers to
    every open. Returns the beats whose rows the policy held back (so a test can show the
    policy's choices were in play)."""
    sim, times, sim_answers, held = run_starts(None, opens, snapshot_mb=snapshot_mb)
    other, _, other_answers, _ = run_starts(scripted(times), opens, snapshot_mb=snapshot_mb)
    assert len(sim) == len(other) and sim_answers == other_answers, \
        f"opens answered differently: sim {sim_answers}, scripted {other_answers}"
    for a, b in zip(sim, other):
        assert a == b, f"beat {a[0]}: sim decided {a}, the other executor {b}"
    return held


# Opens (beat it comes at, prompt characters, beats it stays): up to one more than the slots,
# prompts from none to several chunks. Opens of one beat go out 2 ms apart, in a set order:
# sent at one instant, their arrival order (and so their slots) would be the sockets' choice.
OPENS_5 = st.lists(st.tuples(st.integers(0, 6), st.sampled_from([0, 40, 120, 200, 300, 480]),
                             st.integers(1, 10)), min_size=1, max_size=SLOTS_5 + 1)


@settings(max_examples=30, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.slow
@given(OPENS_5)
@example([(0, 480, 5), (0, 120, 3), (1, 0, 8)])                    # a burst of long prompts
@example([(0, 40, 2), (2, 300, 4), (3, 300, 1), (5, 0, 6)])        # staggered opens and closes
@example([(0, 0, 10)] * SLOTS_5 + [(1, 200, 3)])                   # a full node
@example([(0, 40, 7), (0, 120, 5), (0, 120, 5), (0, 120, 6), (0, 120, 6)])   # closes together
def test_sim_and_engine_make_the_same_start_decisions(opens):
    """Catches: the sim cutting starts into rows unlike the engine (another start shape, prompts
    fitted differently), or any start decision made by an executor rather than by the shared
    slot book and start policy from the measured beats."""
    check_same_starts(opens)


STARTS_CASE = [(0, 480, 20), (0, 300, 20), (0, 40, 20), (1, 0, 20), (2, 200, 6), (6, 480, 10)]


def test_same_start_decisions_with_the_policy_holding_rows_back():
    """The case the mutations use: overrunning beats make the budgeted policy hold rows back,
    and the decisions still agree; without prompt snapshots (every start prefills its rows:
    with them, the shared prompts copy and no rows are held back) and with them."""
    assert check_same_starts(STARTS_CASE, snapshot_mb=0) > 0
    check_same_starts(STARTS_CASE)


# -- 6. a backlog drains once load falls -------------------------------------------------------

OVERLOAD_AT = 6             # beats run before the stretch of overloaded ones


def drain_bound(n_over: int, c_hi: float, c_lo: float) -> int:
    """Low beats until one ends on time: the stretch leaves N (c_hi - beat) of lateness, and a
    beat of c_lo takes back (beat - c_lo) of it; the m-th low beat ends on time once
    N (c_hi - beat) <= m (beat - c_lo)."""
    return max(1, math.ceil(n_over * (c_hi - BEAT_S) / (BEAT_S - c_lo) - 1e-9))


def check_backlog_drains(n_over: int, c_hi: float, c_lo: float) -> None:
    """One live session; beats OVERLOAD_AT .. OVERLOAD_AT + n_over cost c_hi, the rest c_lo.
    Every beat from the drain bound on ends within 160 ms of its release on the drift-free
    schedule (t0 + beat · 160 ms)."""
    def cost(i: int) -> float:
        return c_hi if OVERLOAD_AT <= i < OVERLOAD_AT + n_over else c_lo
    bound = drain_bound(n_over, c_hi, c_lo)
    vn = VirtualNode(2, executor=scripted(cost))
    try:
        vn.run(open_one(vn, "s"))
        vn.settle((OVERLOAD_AT + n_over * c_hi / BEAT_S + bound + 8) * BEAT_S)
        recs = vn.node.clock_actor.stats.records
    finally:
        vn.close()
    t0 = recs[0].release - recs[0].beat * BEAT_S
    late = [i for i, r in enumerate(recs)
            if r.release + r.latency_s - (t0 + r.beat * BEAT_S) > BEAT_S + EPS]
    assert late and late[0] >= OVERLOAD_AT, "the overload did not make beats late"
    first_on_time = OVERLOAD_AT + n_over + bound - 1
    assert len(recs) > first_on_time + 4, "the run ended before the backlog could drain"
    assert late[-1] < first_on_time, \
        f"beat {late[-1]} late; the backlog of {n_over} beats at {1e3 * c_hi:.0f} ms should " \
        f"have drained by beat {first_on_time} at {1e3 * c_lo:.0f} ms"


@settings(max_examples=10, deadline=None, database=None)
@given(st.integers(1, 12), st.floats(0.17, 0.4), st.floats(0.02, 0.12))
def test_a_backlog_drains_within_its_bound_once_load_falls(n_over, c_hi, c_lo):
    """Catches: a schedule that never catches up (beats released relative to the last late one,
    so an overload's lateness stays for good), beats waiting on something beyond the executor
    once behind, or a lateness that shrinks slower than the spare time each light beat gives."""
    check_backlog_drains(n_over, c_hi, c_lo)
