"""The executor contract (wave_actors/core/contract.py), one test module over every executor that
runs here: `sim` and `cpu` everywhere, `graph` where a GPU is. Each is driven as the clock
drives it (`BeatDriver`: the slot book plans, the executor runs), and checked for:

  - slot lifecycle: a session is in the beats once its start is done and never after its close;
    a slot reopened starts its new session from frame 0;
  - outputs to the right slot: a session's outputs do not depend on which other slots share its
    beat or what they hear (a row mix-up shows as a change);
  - every slot in a beat gets outputs (tokens in range, finite audio); a session at the end of
    its context rolls and runs on;
  - `wait` with nothing in flight returns at once; `collect` reports the beat's time;
  - with `caps.first_frame`, frame 0's rows are in the outputs when `wait_first` returns, and
    final.
Stale handles are the clock's table's to reject (tests/runtime/test_session_table.py) and are
checked here once more against an executor's real slot count.
"""
import asyncio

import numpy as np
import pytest

from bench.harness.beat_driver import BeatDriver
from wave_actors.core.contract import Capabilities, ExecutorOptions, SessionSpec
from wave_actors.core.registry import REGISTRY
from wave_actors.core.sched.session_table import SessionTable
from wave_actors.core.timebase import Clock

SLOTS = 4


def build(name: str, **opts):
    options = ExecutorOptions(max_sessions=SLOTS, max_context=48, **opts,
                              profile="reference" if name == "sim" else "fp32")
    if name == "sim":
        from sim.executor import SimExecutor
        return SimExecutor(options, clock=Clock())
    if name == "cpu":
        from gpu.engine.cpu_executor import CpuExecutor
        return CpuExecutor(options)
    from gpu.engine.graph_executor import GraphExecutor
    return GraphExecutor(options)


@pytest.fixture(params=["sim", "cpu", pytest.param("graph", marks=pytest.mark.gpu)])
def name(request):
    return request.param


def audio(beat: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(1000 * seed + beat)
    return (0.1 * rng.standard_normal((SLOTS, 2, 1280))).astype(np.float32)


async def until_ready(driver: BeatDriver, slots: list[int], beats: int = 60) -> int:
    for k in range(beats):
        if all(driver.ready(s) for s in slots):
            return k
        await driver.beat(audio(k))
    raise AssertionError(f"slots {slots} never became ready")


def check_rows(executor, plan, out) -> None:
    vocab = getattr(getattr(executor, "cfg", None), "thinker", None)
    for slot in plan.live:
        assert np.isfinite(out.pcm[slot]).all() and np.abs(out.pcm[slot]).max() > 0
        if vocab is not None:
            assert ((0 <= out.text[slot]) & (out.text[slot] < vocab.vocab)).all()


def test_capabilities_come_from_the_registry(name):
    assert isinstance(REGISTRY[name].caps, Capabilities)
    executor = build(name)
    try:
        assert executor.caps == REGISTRY[name].caps and executor.name == name
        assert executor.describe()["max_sessions"] == SLOTS
    finally:
        executor.close()


def test_slot_lifecycle_and_a_reopened_slot_starts_afresh(name):
    executor = build(name)
    driver = BeatDriver(executor)

    async def body():
        await executor.wait()                                  # nothing in flight: at once
        driver.open(1, SessionSpec("Hi."))
        driver.open(3, SessionSpec("Answer briefly.", [{"name": "lookup", "parameters": {}}]))
        await until_ready(driver, [1, 3])
        for k in range(3):
            plan, out = await driver.beat(audio(k))
            assert plan.live == [1, 3] and out.compute_s > 0
            check_rows(executor, plan, out)
        driver.close(1)
        plan, out = await driver.beat(audio(9))
        assert plan.live == [3]
        first = driver.open(1, SessionSpec("Hi."))
        await until_ready(driver, [1])
        plan, _ = await driver.beat(audio(10))
        row = plan.live.index(1)
        assert plan.frame0[row] == 0 and plan.session[row] == first     # a new session
        assert plan.frame0[plan.live.index(3)] > 0
    try:
        asyncio.run(body())
    finally:
        executor.close()


def test_a_sessions_outputs_do_not_depend_on_its_neighbours(name):
    """Slot 2 alone, then slot 2 beside slots 0 and 3 hearing other audio: slot 2's tokens are
    the same and its audio the same within fp32 batching noise."""
    runs = []
    for neighbours in ([], [0, 3]):
        executor = build(name)
        driver = BeatDriver(executor)

        async def body():
            driver.open(2, SessionSpec("Hi."))
            for s in neighbours:    # prompts of their own: no one waits for slot 2's snapshot
                driver.open(s, SessionSpec(f"Hi, {s}."))
            await until_ready(driver, [2, *neighbours])
            got = []
            for k in range(4):
                a = audio(k, seed=7)
                a[[0, 3]] = audio(k, seed=len(neighbours))[[0, 3]]       # what the others hear
                plan, out = await driver.beat(a)
                assert 2 in plan.live
                got.append((out.text[2].copy(), out.func[2].copy(), out.pcm[2].copy()))
            return got
        try:
            runs.append(asyncio.run(body()))
        finally:
            executor.close()
    for (t0, f0, p0), (t1, f1, p1) in zip(*runs):
        assert (t0 == t1).all() and (f0 == f1).all()
        np.testing.assert_allclose(p0, p1, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_a_session_at_the_end_of_its_context_rolls_and_runs_on(name):
    """Bug: a session that ran `max_context` frames was silenced (PAD and silence until it
    closed). Now it rolls: the plan names it with its sinks, it stays in every beat with real
    outputs, and a model's caches never pass their size."""
    executor = build(name)
    driver = BeatDriver(executor)
    state = getattr(getattr(executor, "runner", None), "state", None)

    async def body():
        driver.open(0, SessionSpec("Hi."))
        await until_ready(driver, [0])
        rolls = []
        for k in range(100):                       # 200 frames through a 48-frame context
            plan, out = await driver.beat(audio(k))
            assert plan.live == [0]
            check_rows(executor, plan, out)
            rolls += plan.roll
            if state is not None:
                assert int(state.thinker.length[0]) <= state.thinker.max_positions
                assert int(state.talker.position[0]) <= state.talker.max_positions
        sink = len(executor.prompt_tokens(SessionSpec("Hi.")))
        assert len(rolls) >= 3 and set(rolls) == {(0, sink)}
    try:
        asyncio.run(body())
    finally:
        executor.close()


def test_stale_handles_cannot_release_an_executors_slot(name):
    executor = build(name)
    try:
        table = SessionTable(executor.max_sessions)
        handles = [table.admit(i, None) for i in range(executor.max_sessions)]
        table.release(handles[2])
        again = table.admit("again", None)
        assert again.slot == handles[2].slot
        assert table.release(handles[2]) is None and table.current(again) is not None
        assert table.stale == 1
    finally:
        executor.close()


def test_frames_are_conserved_and_outputs_reach_only_the_current_handle(name):
    """The clock's path, step by step: frames pushed into the session table are handed to the
    executor once each or counted as dropped, and a beat's outputs go only to the sessions that
    still hold their slot when it completes (a slot released and re-admitted while its beat ran
    gets nothing of that beat)."""
    executor = build(name)
    table = SessionTable(executor.max_sessions)
    driver = BeatDriver(executor)
    inp, out = driver.inp, driver.out
    pushed: dict = {}

    async def beat(release_mid=None):
        plan = driver.book.plan(0.16)
        packed = table.pack(inp, plan.live)
        executor.submit(plan, inp, out)
        fresh = None
        if release_mid is not None:                 # while the beat runs
            table.release(release_mid)
            fresh = table.admit("fresh", "fresh-owner")
        await executor.wait()
        executor.collect(plan, out)
        return plan, table.complete(packed, late=False), fresh

    async def body():
        a, b = table.admit("a", "a-owner"), table.admit("b", "b-owner")
        for h in (a, b):
            driver.open(h.slot, SessionSpec("Hi."))
        for k in range(40):
            if all(driver.ready(h.slot) for h in (a, b)):
                break
            await beat()
        for n in range(8):                          # more than a beat takes: some queue
            for h in (a, b):
                table.push(h, n, audio(n)[h.slot, 0])
                pushed[h] = pushed.get(h, 0) + 1
        plan, routed, _ = await beat()
        assert {e.handle for e, _ in table.entries_of(routed)} == {a, b}
        plan, routed, fresh = await beat(release_mid=a)
        assert fresh.slot == a.slot and fresh != a
        assert {e.handle for e, _ in table.entries_of(routed)} == {b}        # nothing of it to `fresh`
        stats_b = table.release(b)
        assert stats_b.frames_in + stats_b.dropped == pushed[b]
        assert table.release(a) is None and table.stale == 1
    try:
        asyncio.run(body())
    finally:
        executor.close()


def test_launch_times_are_summarised_in_ms_with_their_tail():
    """The graph executor reports how long its worker took to launch beats (as the bench reports
    the host's times); the summary must keep the slowest (a stalled launch is what it is there
    to show)."""
    from wave_actors.core.sched.spread import spread_ms
    assert spread_ms([]) == {"p50": 0.0, "p99": 0.0, "max": 0.0}
    times = [0.002] * 98 + [1.1, 0.5]
    assert spread_ms(times) == {"p50": 2.0, "p99": 506.0, "max": 1100.0}
    assert spread_ms([0.002] * 199 + [1.1])["max"] == 1100.0


def test_first_frame_is_in_the_outputs_when_wait_first_returns(name):
    """Catches a first frame routed before it is written, or from an earlier beat: a sentinel
    put in frame 0's token rows before each beat is gone when `wait_first` returns, and the
    beat's end leaves those rows, and the audio, as they were then (frame 1's rows are written
    by then too). The sim writes its audio rows once (alloc_output): no sentinel there."""
    executor = build(name)
    if not executor.caps.first_frame:
        executor.close()
        pytest.skip(f"{name} routes a beat's frames together")
    driver = BeatDriver(executor)
    seen: dict = {}

    def on_first(plan, out):
        live = list(plan.live)
        seen.update(live=live, text=out.text[live, 0].copy(), pcm=out.pcm[live, 0].copy(),
                    user=out.user[live, 0].copy())

    async def body():
        await executor.wait_first()                     # nothing in flight: returns at once
        for s in (0, 2):
            driver.open(s, SessionSpec("Hi."))
        await until_ready(driver, [0, 2])
        for k in range(3):
            out = driver.out
            out.text[:, 0], out.user[:, 0], out.text[:, 1] = -7, -7, -7
            seen.clear()
            await driver.beat(audio(k), on_first=on_first)
            live = seen["live"]
            assert sorted(live) == [0, 2]
            assert np.isfinite(seen["pcm"]).all() and (seen["text"] != -7).all()
            assert (seen["user"] != -7).all()
            assert np.array_equal(out.pcm[live, 0], seen["pcm"])
            assert np.array_equal(out.text[live, 0], seen["text"])
            assert np.array_equal(out.user[live, 0], seen["user"])
            assert np.isfinite(out.pcm[live]).all() and (out.text[live, 1] != -7).all()
    try:
        asyncio.run(body())
    finally:
        executor.close()
