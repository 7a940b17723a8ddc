"""The actor runtime: mailbox policies, tell/ask, one_for_one supervision."""
import asyncio

import pytest

from wave_actors.runtime.actors import (Actor, ActorStopped, ChildSpec, Envelope, Mailbox,
                                        MailboxFull, MsgClass, Restart, Supervisor)


def run(coro):
    return asyncio.run(coro)


def test_audio_overflow_drops_oldest_audio_and_counts_it():
    async def body():
        mb = Mailbox(audio_cap=3, control_cap=10)
        dropped = []
        mb.on_drop = dropped.append
        mb.put(Envelope("c0", MsgClass.CONTROL))
        for i in range(5):
            mb.put(Envelope(f"a{i}", MsgClass.AUDIO))
        mb.put(Envelope("c1", MsgClass.CONTROL))
        got = [(await mb.get()).msg for _ in range(len(mb))]
        return got, dropped, mb.stats()
    got, dropped, stats = run(body())
    assert got == ["c0", "a2", "a3", "a4", "c1"]          # order kept, control untouched
    assert dropped == ["a0", "a1"] and stats.dropped_audio == 2


def test_control_is_never_dropped_and_overflow_is_loud():
    async def body():
        mb = Mailbox(audio_cap=1, control_cap=2)
        mb.put(Envelope(1, MsgClass.CONTROL))
        mb.put(Envelope(2, MsgClass.CONTROL))
        for i in range(10):
            mb.put(Envelope(i, MsgClass.AUDIO))            # audio overflow never blocks control
        with pytest.raises(MailboxFull):
            mb.put(Envelope(3, MsgClass.CONTROL))
        return [(await mb.get()).msg for _ in range(len(mb))]
    assert run(body()) == [1, 2, 9]


class Echo(Actor):
    def __init__(self, name="echo", fail_on=None):
        super().__init__(name)
        self.fail_on = fail_on
        self.seen = []

    async def handle(self, msg):
        if msg == self.fail_on:
            raise RuntimeError(f"boom on {msg}")
        if msg == "slow":
            await asyncio.sleep(10)
        self.seen.append(msg)
        return ("re", msg)


def test_ask_returns_reply_times_out_and_propagates_errors():
    async def body():
        a = Echo(fail_on="bad")
        a.start()
        assert await a.ask("hi") == ("re", "hi")
        with pytest.raises(asyncio.TimeoutError):
            await a.ask("slow", timeout=0.05)
        a2 = Echo(fail_on="bad")
        a2.start()
        with pytest.raises(RuntimeError, match="boom"):
            await a2.ask("bad")
        await asyncio.gather(a2.task, return_exceptions=True)   # the crash, retrieved
        with pytest.raises(ActorStopped):
            a2.tell("after")
        await a.stop()
    run(body())


def test_one_for_one_restarts_only_the_crashed_child():
    async def body():
        sup = Supervisor(max_restarts=3, window_s=60)
        made = {"a": 0, "b": 0}

        def factory(name):
            def make():
                made[name] += 1
                return Echo(name, fail_on="crash")
            return make
        a = sup.start_child(ChildSpec("a", factory("a")))
        b = sup.start_child(ChildSpec("b", factory("b")))
        b.tell("keep")
        a.tell("crash")
        for _ in range(20):
            await asyncio.sleep(0)
        a2 = sup.get("a")
        assert a2 is not a and made == {"a": 2, "b": 1}
        assert sup.get("b") is b and b.seen == ["keep"]     # sibling untouched
        assert await a2.ask("x") == ("re", "x")
        await sup.stop_all()
    run(body())


def test_restart_intensity_escalates():
    async def body():
        sup = Supervisor(max_restarts=2, window_s=60)
        sup.start_child(ChildSpec("a", lambda: Echo("a", fail_on="crash")))
        for _ in range(2):
            sup.get("a").tell("crash")
            for _ in range(20):
                await asyncio.sleep(0)
        assert sup.restarts == 2 and not sup.failed.is_set()
        sup.get("a").tell("crash")
        await asyncio.wait_for(sup.failed.wait(), 1)
        assert "more than 2 restarts" in str(sup.failure)
        await sup.stop_all()
    run(body())


def test_temporary_child_is_not_restarted_and_cleans_up():
    async def body():
        sup = Supervisor()
        cleaned = []

        async def on_crash(actor, exc):
            cleaned.append((actor.name, str(exc)))
        sup.start_child(ChildSpec("t", lambda: Echo("t", fail_on="crash"), Restart.TEMPORARY,
                                  on_crash))
        sup.get("t").tell("crash")
        for _ in range(20):
            await asyncio.sleep(0)
        assert sup.get("t") is None and cleaned == [("t", "boom on crash")]
    run(body())
