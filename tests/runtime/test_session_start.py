"""`opened` waits for the model's session start (wave_actors/node/node.py, clock.when_ready): a client
streams only once its audio is heard, so a start that takes beats drops nothing; a close or a
drain during the start frees the slot and answers the opener."""
import pytest
import asyncio

import numpy as np

from tests.nodekit import VirtualNode
from tests.runtime.test_protocol_node import client_of, node_on_tcp, raw_dealer, reply
from transports import protocol as P
from wave_actors.clock.slots import PROMISED_MAX
from wave_actors.core.frames import BEAT_S

LONG_PROMPT = "Speak slowly and clearly. " * 5       # ~130 prompt tokens: 9 start rows (sim)


@pytest.mark.slow
def test_opened_comes_when_the_model_is_ready_and_nothing_sent_after_it_is_dropped():
    async def body():
        async with node_on_tcp() as node, client_of(node) as c:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            s = await c.open("long", sample_rate=16000, format="pcm_f32le", instructions=LONG_PROMPT)
            waited = loop.time() - t0
            slot = s.opened["slot"]
            assert node.clock_actor.slots.book.ready(slot)          # its start is done
            assert waited >= 4 * BEAT_S                       # it took the prefill beats
            sent = 25
            for i in range(sent):                             # paced like a live client
                await s.send_audio((0.1 * np.random.randn(1280)).astype(np.float32).tobytes())
                await asyncio.sleep(0.08)
            await asyncio.sleep(0.5)
            closed = await s.close()
            st = closed.stats
            assert st["frames_in"] + st["dropped"] == sent
            assert st["dropped"] <= 3                          # at most the jitter prebuffer
    asyncio.run(body())


async def open_and_wait_in_start(node):
    """A raw client whose `open` is admitted and still prefilling."""
    sock = await raw_dealer(node)
    await sock.send_multipart(P.pack("open", "s", sample_rate=16000, format="pcm_f32le",
                                     instructions=LONG_PROMPT))
    await asyncio.sleep(2 * BEAT_S)
    assert node.clock_actor.free_slots == 0 and not node.sessions
    return sock


def test_close_during_the_start_answers_closed_and_frees_the_slot():
    async def body():
        async with node_on_tcp(max_sessions=1) as node:
            sock = await open_and_wait_in_start(node)
            await sock.send_multipart(P.pack("close", "s"))
            header, _ = await reply(sock)
            assert header["type"] == "closed" and header["session"] == "s"
            assert header["stats"]["frames_in"] == 0
            for _ in range(20):
                if node.clock_actor.free_slots == 1:
                    break
                await asyncio.sleep(0.05)
            assert node.clock_actor.free_slots == 1 and not node.sessions
            async with client_of(node) as c:                  # the slot serves the next one
                s = await c.open("next", sample_rate=16000, format="pcm_f32le")
                assert s.opened["slot"] == 0
            sock.close(0)
    asyncio.run(body())


def test_drain_during_the_start_refuses_the_opener():
    async def body():
        async with node_on_tcp(max_sessions=1) as node:
            sock = await open_and_wait_in_start(node)
            drain = asyncio.get_running_loop().create_task(node.drain(timeout=2))
            header, _ = await reply(sock)
            assert header["type"] == "refused" and header["reason"] == "draining"
            await drain
            sock.close(0)
    asyncio.run(body())


def test_an_open_whose_prompt_is_kept_is_answered_before_the_beat_that_starts_it():
    """Catches a start promised wrongly: an open whose whole prompt has a kept snapshot starts
    by one copy, so it is answered at once (not at the next beat), up to PROMISED_MAX at a
    time, the rest at the beat that plans them; a promised start still runs (its audio is
    heard), and an open that needs prompt rows is never answered before they ran."""
    vn = VirtualNode(12)                       # the node warms the empty prompt at start
    try:
        async def calls():
            await vn.clock.sleep(BEAT_S / 2)      # between two beats
            t0 = vn.clock.now()

            async def one(i, **prompt):
                s = await vn.client.open(f"c{i}", sample_rate=16000, format="pcm_f32le",
                                         **prompt)
                return s, vn.clock.now() - t0
            opened = await asyncio.gather(*(one(i) for i in range(PROMISED_MAX + 2)))
            await vn.clock.sleep(2 * BEAT_S)     # the burst started: nobody waits to start
            t0 = vn.clock.now()
            opened.append(await one("long", instructions=LONG_PROMPT))
            s = opened[0][0]
            for _ in range(25):                  # paced like a live client
                await s.send_audio(np.zeros(1280, np.float32).tobytes())
                await vn.clock.sleep(0.08)
            await vn.clock.sleep(0.5)
            return opened, await s.close()
        opened, closed = vn.run(calls())
    finally:
        vn.close()
    waits = sorted(w for _, w in opened[:-1])
    # the next beat is half a beat away: answered before it, or by it
    assert PROMISED_MAX > 0 and all(w < 0.01 for w in waits[:PROMISED_MAX])
    assert all(BEAT_S / 2 - 0.01 < w < BEAT_S for w in waits[PROMISED_MAX:])
    assert opened[-1][1] >= 4 * BEAT_S                     # its rows first, then answered
    st = closed.stats
    assert st["frames_in"] + st["dropped"] == 25 and st["frames_in"] >= 22
