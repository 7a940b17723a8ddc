"""Session-start work under the budgeted start policy (wave_actors/core/start_policy.py): a start
step runs only in a beat whose time left before its deadline holds the live frames, the step and
a margin; a start that finds no room for `give_up` beats in a row is refused, and its caller told
why, while the live sessions keep every beat."""
import asyncio
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gpu.engine.cpu_executor import CpuExecutor
from tests.engine.test_cpu_executor import SPEC, serve
from tests.nodekit import VirtualNode, slow_cost
from tests.runtime.test_protocol_node import client_of, node_on_tcp
from transports.client import Refused
from wave_actors.core.beat_driver import BeatDriver
from wave_actors.clock import LATE_AFTER_S
from wave_actors.core.contract import ExecutorOptions, SessionSpec
from wave_actors.core.frames import BEAT_S
from wave_actors.core.start_policy import BudgetedStarts, EagerStarts, StartQueue

StartBudget = BudgetedStarts
STEP_MEMORY_BEATS = BudgetedStarts().step_memory_beats
UNMEASURED_START_S = BudgetedStarts().unmeasured_start_s


def test_room_is_the_time_left_less_the_live_cost_and_the_margin():
    b = StartBudget(margin_s=0.01)
    assert b.steps(8, 0.16, 4) == 0            # no live beat measured yet: no room assumed
    b.observe_live(4, 0.0)                     # 8 scales from 4: 0
    assert b.steps(8, 0.05, 4) == 0            # unmeasured step: half a beat, more than 0.04
    assert b.steps(8, 0.1, 4) == 1             # 0.1 − 0.01 ≥ 0.08
    b.observe_live(8, 0.07)
    b.observe_start(0.02)
    assert abs(b.room(8, 0.1) - 0.02) < 1e-12 and b.steps(8, 0.1, 4) == 1
    assert b.steps(8, 0.099, 4) == 0           # a beat that began 1 ms late has no room
    assert b.steps(8, 0.15, 4) == 3            # a light beat runs several steps …
    assert b.steps(8, 0.15, 2) == 2            # … but no more than there are groups
    b.observe_start(0.01)                      # the largest recent step counts, not the last
    assert b.expected_start() == 0.02
    b.observe_live(8, 0.12)                    # smoothed: 0.07 + 0.3 · 0.05 = 0.085
    assert abs(b.expected_live(8) - 0.085) < 1e-12
    assert b.steps(8, 0.1, 4) == 0 and b.held_back == 4
    assert b.steps(0, 0.0, 4) == 1             # no live session to make late: one step
    assert b.steps(0, 0.16, 9) == 7            # (0.16 − 0.01) // 0.02


def test_an_old_slow_step_does_not_hold_starts_back_for_ever():
    """A 120 ms step (a hiccup) among 30 ms ones: while it is recent the budget judges by it;
    once every measurement is older than STEP_MEMORY_BEATS live beats, by the smallest, so one
    step fits again and is measured afresh."""
    b = StartBudget(margin_s=0.0)
    b.observe_live(100, 0.1)
    for seconds in (0.03, 0.12, 0.03):
        b.observe_start(seconds)
    assert b.expected_start() == 0.12 and b.steps(100, 0.16, 4) == 0
    for _ in range(STEP_MEMORY_BEATS + 1):
        b.observe_live(100, 0.1)
    assert b.expected_start() == 0.03 and b.steps(100, 0.16, 4) == 2
    b.observe_start(0.035)
    assert b.expected_start() == 0.035


def test_an_unmeasured_live_count_scales_from_the_closest_measured_one():
    b = StartBudget()
    b.observe_live(10, 0.05)
    b.observe_live(40, 0.08)
    assert b.expected_live(40) == 0.08
    assert abs(b.expected_live(20) - 0.1) < 1e-12      # from 10 (closest), ×2
    assert b.expected_live(36) == 0.08                 # from 40, never scaled down
    assert b.expected_live(0) == 0.0


@settings(max_examples=300, deadline=None)
@given(margin=st.floats(0.0, 0.02),
       beats=st.lists(st.tuples(st.integers(0, 64), st.floats(-0.05, 0.17), st.integers(1, 20),
                                st.floats(0.0, 0.3), st.floats(0.001, 0.1)),
                      min_size=1, max_size=120))
def test_start_steps_fit_before_the_deadline_by_what_was_measured(margin, beats):
    """Invariant: a beat with live sessions runs k start steps only if, by what was measured so
    far, its live frames + k × the largest recent step + the margin fit in its time left, and no
    more would fit (or it ran one per group); so a beat that began behind schedule (time left ≤
    its live cost) runs none, whatever the costs. A beat with none live runs at least one."""
    b = StartBudget(margin_s=margin)
    for n_live, time_left, most, live_s, start_s in beats:
        live, step = b.expected_live(n_live), b.expected_start()
        k = b.steps(n_live, time_left, most)
        assert 0 <= k <= most
        if n_live == 0:
            assert k >= 1
        else:
            assert k == 0 or live + k * step + margin <= time_left + 1e-12
            assert k == most or live + (k + 1) * step + margin > time_left - 1e-12
            if time_left <= live:
                assert k == 0
        b.observe_live(n_live, live_s)
        for _ in range(k):
            b.observe_start(start_s)
    assert b.expected_start() <= max([UNMEASURED_START_S] + [s for *_, s in beats])


def test_the_queue_runs_the_fewest_steps_first_and_refuses_after_give_up():
    q, b = StartQueue(), StartBudget(margin_s=0.0, give_up=2)
    b.observe_live(4, 0.1)
    b.observe_start(0.03)
    for slot in (5, 1, 3):
        q.open(slot)
    assert q.plan(4, 0.15, b, per_step=2) == [[5, 1]]          # 0.05 of room: one step
    assert q.plan(4, 0.2, b, per_step=2) == [[3, 5], [1]]      # 3 has no step yet; then oldest
    assert q.plan(4, 0.1, b, per_step=2) == [] and q.refused(5) is None
    assert q.plan(4, 0.1, b, per_step=2) == [] and "no room" in q.refused(5)
    assert b.given_up == 3 and q.plan(4, 1.0, b, per_step=2) == []   # refused: not planned
    q.close(5)
    assert q.refused(5) is None


def test_a_finished_start_waits_to_go_live_only_while_it_would_take_the_room_of_others():
    """Live sessions cost 12 ms each, a start step 30 ms: with 10 live, one more live session
    leaves 160 − 132 = 28 < 30 ms, so a finished start waits while others still run, and goes
    live once they are done; with 2 live it goes live at once. No budget: at once."""
    q, b = StartQueue(), StartBudget(margin_s=0.0)
    for n in range(1, 13):
        b.observe_live(n, 0.012 * n)
    b.observe_start(0.03)
    for slot in (0, 1):
        q.open(slot)
    q.finished(0)
    assert q.going_live(2, 0.16, b) == [0]                     # light: live at once
    q.open(2)
    q.finished(2)
    assert q.going_live(10, 0.16, b) == []                     # 1 still starts: 2 waits
    assert q.plan(10, 0.16, b, per_step=4) == [[1]]
    q.finished(1)
    assert q.going_live(10, 0.16, b) == [1, 2]                 # none running: all go live
    q.open(3)
    q.finished(3)
    assert q.going_live(12, 0.0, EagerStarts()) == [3]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["open", "close", "beat"]), st.integers(0, 7),
                          st.integers(0, 40), st.floats(0.0, 0.2)), max_size=80))
def test_every_start_goes_live_is_refused_or_is_closed(events):
    """Invariant of the queue under any opens, closes and beats: a slot is in at most one of
    running / finished / live / refused, no slot is planned twice in a beat, and once opens stop,
    beats with room let every start finish and go live (nothing is stranded)."""
    q, b = StartQueue(), StartBudget(margin_s=0.0, give_up=5)
    b.observe_start(0.03)
    opened, live, steps_left = set(), set(), {}
    for kind, slot, n_live, time_left in events:
        if kind == "open" and slot not in opened:
            q.open(slot)
            opened.add(slot)
            steps_left[slot] = 1 + slot % 3
        elif kind == "close" and slot in opened:
            q.close(slot)
            opened.discard(slot)
            live.discard(slot)
        elif kind == "beat":
            b.observe_live(max(1, n_live), 0.003 * n_live)
            planned = [s for g in q.plan(n_live, time_left, b, per_step=3) for s in g]
            assert len(planned) == len(set(planned)) and not set(planned) & live
            for s in planned:
                steps_left[s] -= 1
                if steps_left[s] == 0:
                    q.finished(s)
            went = q.going_live(n_live, time_left, b)
            assert not set(went) & live and set(went) <= opened
            live |= set(went)
    for _ in range(20):                                # no live load, a whole beat: all finish
        for g in q.plan(0, 0.16, b, per_step=3):
            for s in g:
                steps_left[s] -= 1
                if steps_left[s] == 0:
                    q.finished(s)
        live |= set(q.going_live(0, 0.16, b))
    assert all(s in live or q.refused(s) for s in opened)


def _tiny(sessions=2) -> CpuExecutor:
    return CpuExecutor(ExecutorOptions(max_sessions=sessions, profile="fp32", max_context=64))


def _step_slots(plan) -> list[list[int]]:
    return [sorted({i for i, _, _ in st.prefill} | {i for rows in st.warmup.values() for i, _ in rows})
            for st in plan.starts]


def test_a_light_beat_runs_several_start_steps_fewest_steps_first():
    """One slot a step, steps measured at 70 ms: a beat with no live session runs two. The slots
    with the fewest steps go first, the oldest among equals, each at most once a beat."""
    backend = _tiny(3)
    try:
        budget = BudgetedStarts(margin_s=0.0)
        budget.observe_start(0.07)
        driver = BeatDriver(backend, budget)
        book = driver.book
        book.shape = replace(book.shape, starts_per_step=1)
        for slot in (2, 0, 1):                               # opened in this order
            driver.open(slot, SessionSpec("many words of a long prompt " * 20, []))
        assert _step_slots(book.plan(BEAT_S)) == [[2], [0]]
        assert _step_slots(book.plan(BEAT_S)) == [[1], [2]]   # 1 has no step yet; 2 is older
        assert _step_slots(book.plan(BEAT_S)) == [[0], [1]]
        assert _step_slots(book.plan(0.1)) == [[2]]          # less room: one step
    finally:
        backend.close()


def test_a_start_without_room_is_refused_and_the_live_session_keeps_its_frames():
    """A margin longer than any beat: once session 0 is live, no beat has room for session 1's
    start; after `give_up` beats it is refused with the numbers, and it never ran a chunk."""
    backend = _tiny()
    budget = BudgetedStarts(margin_s=1.0, give_up=4)
    driver = BeatDriver(backend, budget)
    try:
        driver.open(0, SessionSpec("Hi.", []))               # nobody live: it starts anyway
        asyncio.run(serve(driver, 2))
        assert driver.ready(0)
        driver.open(1, SPEC)
        log = asyncio.run(serve(driver, 6))
        why = driver.book.refused(1)
        slot = driver.book.slots[1]
    finally:
        backend.close()
    assert all(live[0] for live, _ in log) and not any(live[1] for live, _ in log)
    assert not driver.ready(1) and slot.prompt_done == 0 and slot.warm_done == 0
    assert why and "no room" in why and "1 live sessions" in why
    assert budget.given_up == 1 and budget.held_back == 4
    assert driver.book.refused(0) is None


def test_a_start_held_back_goes_on_once_there_is_room_again():
    """Held back for fewer than `give_up` beats, a start resumes when a beat has room (here: the
    beat's time left grows back, as after a backlog drains) and the session goes live."""
    backend = _tiny()
    budget = BudgetedStarts(margin_s=0.0, give_up=50)
    driver = BeatDriver(backend, budget)
    try:
        driver.open(0, SessionSpec("Hi.", []))
        asyncio.run(serve(driver, 2))
        driver.open(1, SPEC)
        held = 0

        async def beats():
            nonlocal held
            for k in range(60):
                before = budget.held_back
                await driver.beat(None, 0.0 if k < 10 else 1e3)   # ten beats behind, then room
                held += budget.held_back - before
                if driver.ready(1):
                    return k
            return None
        went_live = asyncio.run(beats())
    finally:
        backend.close()
    assert held == 10 and went_live is not None and went_live > 10
    assert driver.book.refused(1) is None and budget.given_up == 0


def test_the_node_refuses_an_open_whose_start_finds_no_room():
    """Through the node and the protocol: the caller of a start the device has no room for gets
    `refused` (capacity) with the policy's reason, the slot is freed, and the live session's
    beats go on."""
    async def body():
        backend = _tiny()
        policy = BudgetedStarts(margin_s=1.0, give_up=3)
        async with node_on_tcp(backend=backend, start_policy=policy) as node, client_of(node) as c:
            first = await c.open("first", sample_rate=16000, format="pcm_f32le")
            with pytest.raises(Refused) as refused:
                await c.open("second", sample_rate=16000, format="pcm_f32le")
            assert refused.value.reason == "capacity" and "no room" in refused.value.message
            beats = node.clock_actor.stats.beats
            for _ in range(3):
                await first.send_audio(np.zeros(1280, np.float32).tobytes())
            await asyncio.sleep(0.5)
            assert node.clock_actor.stats.beats > beats                 # it kept beating
            assert node.clock_actor.free_slots == 1 and node.counters.refusals == {"capacity": 1}
            await first.close()
    asyncio.run(body())


def test_the_clock_gives_a_beat_its_time_left():
    """BeatInput.time_left_s: 160 ms less how late the beat was planned and the clock's own
    share of recent beats; the start policy plans the beat's starts with it."""
    seen = []

    class Recording(CpuExecutor):
        def submit(self, plan, inp, out):
            seen.append(inp.time_left_s)
            return super().submit(plan, inp, out)

    async def body():
        backend = Recording(ExecutorOptions(max_sessions=1, profile="fp32", max_context=64))
        async with node_on_tcp(max_sessions=1, backend=backend) as node, client_of(node) as c:
            s = await c.open("a", sample_rate=16000, format="pcm_f32le")
            for _ in range(8):
                await s.send_audio(np.zeros(1280, np.float32).tobytes())
                await asyncio.sleep(0.08)
            await s.close()
            return list(node.clock_actor.stats.records)
    records = asyncio.run(body())
    # every beat the executor ran is recorded, but the drain may stop the last before its record
    assert len(seen) - 1 <= len(records) <= len(seen) and any(r.sessions for r in records)
    host = []                                        # the clock's share of beats with sessions
    for t, r in zip(seen, records):
        assert abs(t - (LATE_AFTER_S - r.begin_s - max(host[-16:], default=0.0))) < 1e-9
        if r.sessions:
            host.append(max(0.0, r.latency_s - r.begin_s - r.compute_s))
    assert max(host) > 0 and min(seen) < LATE_AFTER_S


def test_the_simulator_refuses_a_start_at_capacity_and_no_beat_is_late(tmp_path):
    """The sim executor follows the engine's start policy, on virtual time: with 50 ms a session,
    three live sessions leave 10 ms of a beat, less than a start step (its slot's 50 ms), so the
    fourth open is refused after `give_up` beats, and no beat of the live three was late."""
    vn = VirtualNode(4, cost=slow_cost(tmp_path, per_session_ms=50.0))
    try:
        opened = [vn.run(vn.client.open(f"s{i}", sample_rate=16000, format="pcm_f32le"))
                  for i in range(3)]
        assert len(opened) == 3
        t0 = vn.clock.now()
        with pytest.raises(Refused) as refused:
            vn.run(vn.client.open("fourth", sample_rate=16000, format="pcm_f32le"))   # 10 s
        waited = vn.clock.now() - t0
        stats = vn.node.clock_actor.stats
        budget = vn.node.start_policy
    finally:
        vn.close()
    assert refused.value.reason == "capacity" and "3 live sessions" in refused.value.message
    assert budget.given_up == 1 and budget.held_back >= budget.give_up
    assert budget.give_up * BEAT_S <= waited <= (budget.give_up + 4) * BEAT_S
    assert stats.beats > budget.give_up and stats.late_beats == 0
