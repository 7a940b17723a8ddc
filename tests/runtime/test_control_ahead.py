"""Control messages do not wait behind a slow release. The bug: the clock actor handled a
`Release` whose session's end-of-stream marker had not come yet by waiting for it (up to
0.5 s) before the next message, so `Admit`s queued behind it; with the 5 s ask timeout a run
of such releases turned opens into "not ready" refusals."""
import asyncio
import types

from tests.nodekit import VirtualNode
from wave_actors.clock.clock import Admit, Release, STREAM_END_WAIT_S
from wave_actors.core.contract import SessionSpec


def test_an_admit_is_answered_while_a_release_waits_for_its_marker():
    vn = VirtualNode(max_sessions=3)
    try:
        async def go():
            s = await vn.client.open("leaving", sample_rate=16000, format="pcm_f32le")
            clock = vn.node.clock_actor
            (handle,) = [e.handle for e in clock.slots.table.entries.values()]
            loop = asyncio.get_running_loop()
            t0, done = loop.time(), {}

            async def timed(name, msg):
                result = await clock.ask(msg)
                done[name] = loop.time() - t0
                return result

            # its marker never comes (the session sent none): the release waits it out
            release = asyncio.create_task(timed("release", Release(handle, stream_ended=True)))
            admit = asyncio.create_task(timed("admit", Admit(
                ("late", 1), types.SimpleNamespace(actor=None), SessionSpec("", []))))
            newcomer = await admit
            stats = await release
            assert done["admit"] < 0.05 < STREAM_END_WAIT_S - 0.05 < done["release"]
            assert stats is not None and clock.slots.table.current(handle) is None
            assert newcomer.slot != handle.slot                    # it was still held
            assert await clock.ask(Release(newcomer)) is not None
        vn.run(go())
    finally:
        vn.close()


def test_a_deferred_answer_is_settled_in_its_own_time_and_refused_once_the_actor_stops():
    from wave_actors.runtime.actors import Actor, ActorStopped, Later

    class Refusal(Exception):
        pass

    class Slow(Actor):
        reply_errors = (Refusal,)

        async def handle(self, msg):
            if msg == "now":
                return "now"
            if msg == "refuse":
                async def no():
                    raise Refusal("no")
                return Later(no())
            return Later(asyncio.sleep(msg, "later"))

    async def go():
        actor = Slow("slow")
        actor.start()
        slow = asyncio.create_task(actor.ask(0.2))
        assert await actor.ask("now") == "now" and not slow.done()     # not behind the wait
        assert await slow == "later"
        try:
            await actor.ask("refuse")
            raise AssertionError("the refusal did not reach the asker")
        except Refusal:
            pass
        pending = asyncio.create_task(actor.ask(10.0, timeout=20))
        await asyncio.sleep(0.01)
        await actor.stop()
        try:
            await pending
            raise AssertionError("a stopped actor's pending answer must fail")
        except ActorStopped:
            pass
    asyncio.run(go())
