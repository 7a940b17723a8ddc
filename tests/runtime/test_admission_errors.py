"""Errors in admission are named, not guessed. The bugs: the front caught `AttributeError` to
mean "no clock yet" and refused `capacity` (a bug anywhere in admission looked like a full node),
and a failure tokenizing one caller's prompt crashed the clock actor, restarting it under every
other caller."""
import asyncio

import numpy as np
import pytest

from sim.executor import SimExecutor
from tests.nodekit import VirtualNode
from transports.client import Audio, Refused


class FaultyTokenizer(SimExecutor):
    def prompt_tokens(self, spec):
        if spec.instructions == "boom":
            raise AttributeError("planted: a bug while tokenizing")
        return super().prompt_tokens(spec)


async def first_audio(session, timeout: float = 5.0) -> Audio:
    while True:
        ev = await session.next_event(timeout)
        if isinstance(ev, Audio):
            return ev


def test_a_bug_in_one_admission_is_an_internal_error_for_that_opener_alone():
    vn = VirtualNode(max_sessions=3, executor=FaultyTokenizer)
    try:
        clock = vn.node.clock_actor
        live = vn.run(vn.client.open("live", sample_rate=16000, format="pcm_f32le"))
        with pytest.raises(Refused) as exc:
            vn.run(vn.client.open("bad", sample_rate=16000, format="pcm_f32le",
                                  instructions="boom"))
        assert exc.value.reason == "internal" and "internal" in str(exc.value)
        assert vn.node.counters.errors.get("internal") == 1
        assert sum(vn.node.counters.refusals.values()) == 0          # not a capacity refusal
        assert vn.node.clock_actor is clock                          # the clock lived on
        assert vn.node.clock_actor.free_slots == 2                   # nothing held for it
        frame = (0.1 * np.ones(1280)).astype(np.float32).tobytes()
        for _ in range(6):
            vn.run(live.send_audio(frame))
            vn.settle(0.08)
        assert isinstance(vn.run(first_audio(live)), Audio)        # the live call carries on
        again = vn.run(vn.client.open("next", sample_rate=16000, format="pcm_f32le"))
        assert again.opened["slot"] is not None
    finally:
        vn.close()


def test_no_clock_yet_is_a_capacity_refusal_that_says_so():
    vn = VirtualNode(max_sessions=2)
    try:
        supervisor = vn.node.supervisor
        vn.run(supervisor.stop_child("clock"))                      # as while it restarts
        assert vn.node.clock_actor is None
        with pytest.raises(Refused) as exc:
            vn.run(asyncio.wait_for(vn.client.open("early", sample_rate=16000,
                                                   format="pcm_f32le"), 5))
        assert exc.value.reason == "capacity" and "not ready" in str(exc.value)
        assert not vn.node.counters.errors
    finally:
        vn.close()
