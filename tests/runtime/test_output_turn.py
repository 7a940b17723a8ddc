"""The beat clock holds the session actors' output work around each release (output_turn), on
virtual time with a real node: a backend that reports when its beat's device work is queued.

Invariant: a session's output work asked for at time t runs at t, unless t falls in a hold,
[release − the policy's release hold, the launch of that release's beat): then it runs at that launch, never
inside the hold; and outputs still reach every session, in order."""
import asyncio

from hypothesis import given, settings, strategies as st

from dataclasses import replace

from sim.executor import SimExecutor
from tests.nodekit import VirtualNode
import numpy as np

from transports import protocol as P
from transports.client import Audio, Closed
from wave_actors.core.contract import MAX_USER_TOKENS, NO_TOKEN
from wave_actors.core.frames import FRAMES_PER_BEAT, SAMPLES_OUT
from wave_actors.clock.shared_outputs import BeatOut
from wave_actors.core.sched.clock_policy import ClockPolicy
from wave_actors.core.frames import BEAT_S

OUT_HOLD_S = ClockPolicy().release_hold_s

QUEUE_S = 0.004          # the modelled host time to queue a beat's device work


class LaunchingSim(SimExecutor):
    """The sim executor with a launch: a beat first spends QUEUE_S queueing its work."""
    caps = replace(SimExecutor.caps, reports_launch=True)

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.launches: list[float] = []
        self._launch_at: float | None = None

    def submit(self, plan, inp, out):
        super().submit(plan, inp, out)
        end, total = self._inflight
        self._inflight = (end + QUEUE_S, total + QUEUE_S)
        self._launch_at = self.clock.now() + QUEUE_S

    async def wait(self):
        if self._launch_at is not None:
            await self.clock.sleep_until(self._launch_at)
            self._launch_at = None
            self.launches.append(self.clock.now())
            self.on_launched()
        await super().wait()


def expected_turn(t: float, t0: float, launches: list[float]) -> float:
    for launch in launches:
        release = t0 + round((launch - QUEUE_S - t0) / BEAT_S) * BEAT_S
        if release - OUT_HOLD_S <= t < launch:
            return launch
    return t


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(0.0, 6 * BEAT_S), min_size=1, max_size=30))
def test_output_work_waits_out_the_hold_around_each_release(offsets):
    vn = VirtualNode(2, executor=LaunchingSim)
    try:
        cs = vn.run(vn.client.open("a", sample_rate=16000, format="pcm_f32le"))
        clock = vn.node.clock_actor
        start = vn.clock.now()
        turns: list[tuple[float, float]] = []

        async def probe(at: float):
            await vn.clock.sleep_until(at)
            asked = vn.clock.now()
            await clock.output_turn()
            turns.append((asked, vn.clock.now()))

        async def body():
            feed = [cs.send_audio(bytes(4 * 1280)) for _ in range(60)]
            for f in feed:
                await f
            # and inside every hold of beats 2-5, both before and after the release
            inside = [clock.t0 + k * BEAT_S + d for k in range(2, 6)
                      for d in (-OUT_HOLD_S / 2, QUEUE_S / 2)]
            await asyncio.gather(*(probe(start + o) for o in offsets), *(probe(t) for t in inside))
            await vn.clock.sleep_until(start + 6.5 * BEAT_S)
        vn.run(body())
        launches = vn.executor.launches
        assert len(launches) >= 6
        for asked, ran in turns:
            assert abs(ran - expected_turn(asked, clock.t0, launches)) < 1e-9, (asked, ran)
        assert sum(ran > asked for asked, ran in turns) >= 8        # the holds were exercised
        got = vn.run(_audio(cs, 10))
        assert [e.seq for e in got] == list(range(len(got)))
    finally:
        vn.close()


async def _audio(cs, n: int) -> list:
    got = []
    while len(got) < n:
        ev = await cs.next_event(5.0)
        if isinstance(ev, Audio):
            got.append(ev)
    return got


def test_with_hold_inputs_client_audio_waits_out_the_hold_too():
    """ClockPolicy(hold_inputs=True): audio that reaches a session inside a hold is taken in at
    that beat's launch, not before (the bug it catches: a burst of input work run just before a
    release, delaying it); outside a hold it is taken in at once, and none is lost."""
    vn = VirtualNode(2, executor=LaunchingSim, clock_policy=ClockPolicy(hold_inputs=True))
    try:
        cs = vn.run(vn.client.open("a", sample_rate=16000, format="pcm_f32le"))
        clock = vn.node.clock_actor
        actor = next(iter(vn.node.bindings.routes.values())).actor
        seen: list[tuple[float, int]] = []

        async def send_at(at: float) -> None:
            await vn.clock.sleep_until(at)
            before = actor.counters.messages_in
            await cs.send_audio(bytes(4 * 1280))
            while actor.counters.messages_in == before:
                await vn.clock.sleep(1e-4)
            seen.append((at, vn.clock.now()))

        async def body():
            k = int((vn.clock.now() - clock.t0) / BEAT_S) + 2
            inside = clock.t0 + k * BEAT_S - OUT_HOLD_S / 2
            outside = clock.t0 + (k + 1) * BEAT_S + BEAT_S / 2
            await send_at(inside)
            await send_at(outside)
        vn.run(body())
        (asked_in, took_in), (asked_out, took_out) = seen
        launch = next(t for t in vn.executor.launches if t > asked_in)
        assert abs(took_in - launch) < 2e-4, (asked_in, took_in, launch)
        assert took_out - asked_out < 2e-4
        assert actor.counters.messages_in == 2
    finally:
        vn.close()


def _fake_beat(first_frame: int) -> BeatOut:
    header = {"frame": first_frame, "text": [NO_TOKEN] * FRAMES_PER_BEAT,
              "func": [NO_TOKEN] * FRAMES_PER_BEAT,
              "user": [[NO_TOKEN] * MAX_USER_TOKENS] * FRAMES_PER_BEAT}
    return BeatOut(header, np.zeros((FRAMES_PER_BEAT, SAMPLES_OUT), np.float32))


def test_a_session_whose_outputs_wait_still_takes_its_audio_and_sends_them_before_closed():
    """Output work waits out a hold in the clock's queue, not in the session's mailbox. The
    bugs it catches: a client's audio stuck behind its session's waiting output until the
    launch (its frame misses the beat: an underrun), and a close that loses or reorders what
    still waited."""
    vn = VirtualNode(2, executor=LaunchingSim)
    try:
        cs = vn.run(vn.client.open("a", sample_rate=16000, format="pcm_f32le"))
        clock = vn.node.clock_actor
        actor = next(iter(vn.node.bindings.routes.values())).actor
        events: list = []

        async def body():
            k = int((vn.clock.now() - clock.t0) / BEAT_S) + 2
            await vn.clock.sleep_until(clock.t0 + k * BEAT_S - OUT_HOLD_S / 2)   # a hold
            assert clock.turns.held
            sent = actor.out_seq
            actor.tell(_fake_beat(10_000))
            await vn.clock.sleep(1e-5)
            assert actor.out_seq == sent                 # the output waits for its turn
            before = actor.counters.messages_in
            await cs.send_audio(bytes(4 * 1280))
            await vn.clock.sleep(1e-4)
            assert clock.turns.held
            assert actor.counters.messages_in == before + 1     # audio taken inside the hold
            actor.tell(_fake_beat(10_002))
            await vn.clock.sleep(1e-5)
            # The close asked without `cs.close()`, which skips the events before `closed`.
            await cs.client.send(P.pack("close", cs.id), 5.0)
            while True:
                ev = await cs.next_event(5.0)
                events.append(ev)
                if isinstance(ev, Closed):
                    break
        vn.run(body())
        frames = [e.frame for e in events if isinstance(e, Audio) and e.frame >= 10_000]
        assert frames == [10_000, 10_001, 10_002, 10_003]     # all sent, in order, before closed
    finally:
        vn.close()
