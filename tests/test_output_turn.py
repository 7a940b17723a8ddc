"""The beat clock holds the session actors' output work around each release (output_turn), on
virtual time with a real node: a backend that reports when its beat's device work is queued.

Invariant: a session's output work asked for at time t runs at t, unless t falls in a hold,
[release − OUT_HOLD_S, the launch of that release's beat): then it runs at that launch, never
inside the hold; and outputs still reach every session, in order."""
import asyncio

from hypothesis import given, settings, strategies as st

from sim.backend import SimBackend
from tests.nodekit import VirtualNode
from transports.client import Audio
from wave_actors.clock import OUT_HOLD_S
from wave_actors.frames import BEAT_S

QUEUE_S = 0.004          # the modelled host time to queue a beat's device work


class LaunchingSim(SimBackend):
    """The sim backend with a launch: a beat first spends QUEUE_S queueing its work."""
    reports_launch = True

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.launches: list[float] = []

    async def run_beat(self, inp, out):
        await self.clock.sleep(QUEUE_S)
        self.launches.append(self.clock.now())
        self.on_launched()
        return await super().run_beat(inp, out)


def expected_turn(t: float, t0: float, launches: list[float]) -> float:
    for launch in launches:
        release = t0 + round((launch - QUEUE_S - t0) / BEAT_S) * BEAT_S
        if release - OUT_HOLD_S <= t < launch:
            return launch
    return t


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(0.0, 6 * BEAT_S), min_size=1, max_size=30))
def test_output_work_waits_out_the_hold_around_each_release(offsets):
    vn = VirtualNode(2, backend=LaunchingSim)
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
        launches = vn.backend.launches
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
