"""A closed session leaves nothing for the cyclic collector.

While a node serves, Python's automatic collector is off and the beat clock runs a full
collection only every FULL_EVERY beats (`runtime/gc_pauses.py`). Whatever a closed session
leaves in a reference cycle therefore stays in memory for minutes: with calls coming and going
the node's resident memory climbed ~40 MB before the first full collection in a soak. These
tests run with the collector off and need the session's objects gone by reference counting
alone.
"""
import asyncio
import contextlib
import gc
import weakref

import numpy as np

from tests.tcpkit import client_of, node_on_tcp
from wave_actors.runtime.actors import Actor, ChildSpec, Restart, Supervisor

FRAME = np.zeros(1280, np.float32).tobytes()        # 80 ms at 16 kHz, pcm_f32le


@contextlib.contextmanager
def collector_off():
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Echo(Actor):
    async def handle(self, msg):
        return msg


def test_a_stopped_child_is_freed_without_a_collection():
    """Bug: the actor kept its ended task, whose CancelledError's traceback held the actor's
    frames (a cycle), and the supervisor's watcher did the same with its child."""
    async def body():
        sup = Supervisor()
        actor = sup.start_child(ChildSpec("echo", lambda: Echo("echo"), Restart.TEMPORARY))
        assert await actor.ask("hi") == "hi"
        gone = weakref.ref(actor)
        del actor
        await sup.stop_child("echo")
        await asyncio.sleep(0)              # done callbacks run
        return gone
    with collector_off():
        gone = asyncio.run(body())
        assert gone() is None


def test_a_closed_session_is_freed_without_a_collection():
    """Bug: a closed session's actor, mailbox, reorder buffer and resamplers stayed in cycles
    (its run task, its supervisor's watcher, a cancelled gap timer) until a full collection."""
    async def body():
        async with node_on_tcp() as node, client_of(node) as c:
            s = await c.open("call", format="pcm_f32le")
            for seq in (0, 2, 3):               # seq 1 missing: the gap timer is running
                await s.send_audio(FRAME, seq=seq)
            await asyncio.sleep(0.05)
            (actor,) = node.sessions.values()
            gone = weakref.ref(actor)
            del actor
            await s.close()
            for _ in range(50):
                if gone() is None:
                    break
                await asyncio.sleep(0.02)
            return gone
    with collector_off():
        gone = asyncio.run(body())
        assert gone() is None
