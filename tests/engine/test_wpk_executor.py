"""The `wpk` executor on a GPU: its beats equal the graph executor's bit for bit (the same kernels
and graphs, started by the resident controller's doorbell), with the frames read on the device
out of a real shared ring; a place written again is silent and reported torn; captures between
beats run with the controller drained; and a controller given up by its watchdog leaves the
executor serving graph beats with the same outputs."""
import asyncio

import numpy as np
import pytest

from bench.harness.beat_driver import BeatDriver
from wave_actors.core.contract import ExecutorOptions, SessionSpec
from wave_actors.core.frames import FRAMES_PER_BEAT, SAMPLES_IN
from wave_actors.core.sched.jitter import SILENCE
from wave_actors.core.sched.frame_places import FramesToRead, RingPlaces
from wave_actors.clock.shared_frames import SharedFrames

pytestmark = pytest.mark.gpu

SLOTS, BEATS, RING = 5, 24, 8
OPTS = dict(max_sessions=SLOTS, profile="reference", config="tiny", max_context=128)


def audio_of(beat: int) -> np.ndarray:
    rng = np.random.default_rng(beat)
    return (0.1 * rng.standard_normal((SLOTS, FRAMES_PER_BEAT, SAMPLES_IN))).astype(np.float32)


def drive(executor, ring=None, torn_at: int | None = None, between=None):
    """BEATS beats of 3 sessions; with `ring`, each beat's frames are written into the shared
    ring and only named to the executor (the clock's packed audio left zero). `torn_at`: in that
    beat slot 0's frame 1 is named with a number its place does not hold."""
    driver = BeatDriver(executor)
    gens = np.arange(SLOTS, dtype=np.int64) + 100
    for slot in (0, 2, 4):
        driver.open(slot, SessionSpec(instructions=f"caller {slot}"))
    got, torn = [], []

    def heard(plan):
        audio = audio_of(driver.beats)
        if ring is None:
            return audio
        places = np.zeros((SLOTS, FRAMES_PER_BEAT), np.int64)
        nums = np.full((SLOTS, FRAMES_PER_BEAT), SILENCE, np.int64)
        for slot in plan.live:
            for f in range(FRAMES_PER_BEAT):
                num = 2 * driver.beats + f
                ring.write(slot, int(gens[slot]), num, audio[slot, f])
                places[slot, f] = ring.places(np.array([slot]), np.array([num]))[0]
                nums[slot, f] = num
        if driver.beats == torn_at and 0 in plan.live:
            nums[0, 1] += RING                   # the place holds an older frame
        driver.inp.frames = FramesToRead(RingPlaces(ring, gens), places, gens, nums)
        return np.zeros_like(audio)

    async def run():
        for k in range(BEATS):
            if between is not None:
                between(k)
            plan, out = await driver.beat(heard)
            if ring is not None:
                torn.extend((int(s), int(f)) for ss, ff in driver.inp.frames.torn
                            for s, f in zip(ss, ff))
            got.append({s: (out.text[s].copy(), out.pcm[s].copy(), out.user[s].copy())
                        for s in plan.live})
    asyncio.run(run())
    return got, torn


def equal(a, b) -> None:
    assert len(a) == len(b)
    for k, (x, y) in enumerate(zip(a, b)):
        assert x.keys() == y.keys(), k
        for s in x:
            for u, v in zip(x[s], y[s]):
                np.testing.assert_array_equal(u, v, err_msg=f"beat {k} slot {s}")


@pytest.fixture(scope="module")
def graph_run():
    from gpu.engine.graph_executor import GraphExecutor
    g = GraphExecutor(ExecutorOptions(**OPTS))
    try:
        return drive(g)[0]
    finally:
        g.close()


@pytest.fixture
def ring():
    r = SharedFrames.create(SLOTS, RING)
    assert r is not None
    yield r
    r.close()


def test_wpk_beats_equal_graph_beats_with_frames_read_from_the_ring(graph_run, ring):
    from gpu.engine.wpk_executor import WpkExecutor
    w = WpkExecutor(ExecutorOptions(**OPTS))
    try:
        got, torn = drive(w, ring)
        facts = w.describe()["wpk"]
    finally:
        w.close()
    equal(got, graph_run)
    assert torn == []
    assert facts["failed"] is None and facts["frames_read_on_device"]
    assert facts["doorbell_beats"] == BEATS and facts["fallback_beats"] == 0, facts


def test_a_rewritten_place_is_heard_as_silence_and_reported(ring):
    from gpu.engine.wpk_executor import WpkExecutor
    w = WpkExecutor(ExecutorOptions(**OPTS))
    try:
        _got, torn = drive(w, ring, torn_at=BEATS - 2)
    finally:
        w.close()
    assert torn == [(0, 1)]


def test_captures_between_beats_drain_the_controller_and_beats_go_on(graph_run):
    from gpu.engine.wpk_executor import WpkExecutor
    w = WpkExecutor(ExecutorOptions(**OPTS))
    try:
        got, _ = drive(w, between=lambda k: w.prepare(1) if k == BEATS // 2 else None)
        facts = w.describe()["wpk"]
        assert (1, 0) in w.graphs.captured
    finally:
        w.close()
    equal(got, graph_run)
    assert facts["failed"] is None and facts["doorbell_beats"] == BEATS


def test_a_controller_given_up_by_its_watchdog_leaves_graph_beats_with_equal_outputs(graph_run):
    """A watchdog that judges every beat late gives the controller up at the first beat: the
    executor must then serve the rest from its graphs, outputs unchanged, nothing hung."""
    from gpu.engine.wpk_executor import WpkExecutor
    w = WpkExecutor(ExecutorOptions(**OPTS), watchdog_s=1e-6)
    try:
        got, _ = drive(w)
        facts = w.describe()["wpk"]
    finally:
        w.close()
    equal(got, graph_run)
    assert facts["failed"] and facts["fallback_beats"] > 0, facts
