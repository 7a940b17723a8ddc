"""Session-start work under a beat budget (gpu/engine/start_budget.py): start chunks run only in
beats with room for them, and a start is never held back longer than `max_wait` beats."""
import asyncio

from hypothesis import given, settings, strategies as st

from gpu.engine.cpu_backend import CpuBackend
from gpu.engine.start_budget import StartBudget
from tests.test_cpu_backend import SPEC, serve
from wave_actors.backend import SessionSpec
from wave_actors.backends import BackendOptions


def test_unmeasured_costs_allow_start_work_then_measured_ones_decide():
    b = StartBudget(budget_s=0.11)
    assert b.allow(8)                          # nothing measured yet: measure it once
    b.observe_live(8, 0.07)
    b.observe_start(0.02)
    assert b.allow(8)                          # 0.07 + 0.02 fits in 0.11
    b.observe_start(0.06)                      # smoothed: 0.02 + 0.3 · 0.04 = 0.032
    assert abs(b.start_s - 0.032) < 1e-12 and b.allow(8)
    b.observe_live(8, 0.12)                    # 0.085 + 0.032 > 0.11
    assert not b.allow(8) and b.held_back == 1
    assert b.allow(0)                          # no live session to make late


def test_an_unmeasured_live_count_scales_from_the_closest_measured_one():
    b = StartBudget(budget_s=0.1)
    b.observe_live(10, 0.05)
    b.observe_live(40, 0.08)
    assert b.expected_live(40) == 0.08
    assert abs(b.expected_live(20) - 0.1) < 1e-12      # from 10 (closest), ×2
    assert b.expected_live(36) == 0.08                 # from 40, never scaled down
    assert b.expected_live(0) == 0.0


@settings(max_examples=200, deadline=None)
@given(budget=st.floats(0.01, 0.2), max_wait=st.integers(0, 20),
       beats=st.lists(st.tuples(st.integers(0, 64), st.floats(0.0, 0.3), st.floats(0.0, 0.1)),
                      min_size=1, max_size=120))
def test_start_work_runs_within_budget_or_after_max_wait(budget, max_wait, beats):
    """Invariant: a beat runs start work iff its expected live cost + start cost fits the budget,
    or no session is live, or start work was held back `max_wait` beats in a row; so no start
    waits longer than max_wait + 1 beats whatever the measured costs."""
    b = StartBudget(budget_s=budget, max_wait=max_wait)
    in_a_row = 0
    for n_live, live_s, start_s in beats:
        fits = n_live == 0 or b.expected_live(n_live) + b.start_s <= budget
        allowed = b.allow(n_live)
        assert allowed == (fits or in_a_row >= max_wait)
        in_a_row = 0 if allowed else in_a_row + 1
        assert in_a_row <= max_wait
        b.observe_live(n_live, live_s)
        if allowed:
            b.observe_start(start_s)


def test_backend_holds_starts_back_while_the_beat_is_full_and_still_starts_them():
    """A zero budget (every beat full): a second session's start runs only every max_wait + 1
    beats, the first session keeps its frames every beat, and the second still goes live."""
    backend = CpuBackend(BackendOptions(max_sessions=2, profile="fp32", max_context=64))
    try:
        backend.open_slot(0, SessionSpec("Hi.", []))
        asyncio.run(serve(backend, 2))
        assert backend.ready(0)
        backend.start_budget = StartBudget(budget_s=0.0, max_wait=3)
        backend.open_slot(1, SPEC)
        log = asyncio.run(serve(backend, 40))
    finally:
        backend.close()
    assert all(live[0] for live, _ in log)
    live_from = next(k for k, (live, _) in enumerate(log) if live[1])
    assert backend.start_budget.forced >= 2 and backend.start_budget.held_back >= 6
    # each chunk waited 3 beats: the start took about 4× the beats it takes unbudgeted
    assert live_from >= 4 * backend.start_budget.forced - 1
