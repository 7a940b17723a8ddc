"""FrameBatcher: a loop turn's frames of many sessions in one message to the clock.

Bugs it catches: rows that lose their session, number or samples on the way (the clock would
feed one caller's audio to another); a marker overtaking its session's frames (the clock would
free the slot with frames still in flight); frames of a batch that cannot be sent going
uncounted."""
import asyncio
import itertools

import numpy as np
import zmq
import zmq.asyncio
from hypothesis import given, settings, strategies as st

from transports import zsock
from wave_actors.clock import frame_batch
from wave_actors.core.frames import SAMPLES_IN
from wave_actors.core.sched.session_table import END_OF_STREAM
from wave_actors.clock.frame_batch import FrameBatcher


_ENDPOINTS = itertools.count()


async def _pair():
    ctx = zmq.asyncio.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    # Named by a count, not by id(): a closed socket's name stays bound until the context reaps
    # it, and a new socket may get the closed one's id.
    endpoint = f"inproc://frame-batch-{next(_ENDPOINTS)}"
    router.bind(endpoint)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    return router, dealer


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 511), st.integers(0, 2 ** 50), st.integers(0, 10 ** 6),
                          st.booleans()), min_size=1, max_size=40))
def test_a_turns_frames_arrive_as_one_message_row_for_row_in_order(rows):
    async def body():
        router, dealer = await _pair()
        batcher = FrameBatcher(zsock.Tx(dealer))
        sent = []
        for i, (slot, gen, no, marker) in enumerate(rows):
            if marker:
                batcher.add(slot, gen, END_OF_STREAM, None)
                sent.append((slot, gen, END_OF_STREAM, np.zeros(SAMPLES_IN, np.float32)))
            else:
                pcm = np.full(SAMPLES_IN, i + 0.5, np.float32)
                batcher.add(slot, gen, no, pcm)
                sent.append((slot, gen, no, pcm))
        await asyncio.sleep(0)                     # the turn ends: one send
        msg = await asyncio.wait_for(router.recv_multipart(), 1.0)
        assert msg[1] == frame_batch.BATCH_TAG and batcher.batches == 1
        head, pcm = frame_batch.decode(msg[2], msg[3])
        assert [tuple(r) for r in head.tolist()] == [s[:3] for s in sent]
        for (_, _, _, want), got in zip(sent, pcm):
            assert np.array_equal(want, got)
        router.close(0)
        dealer.close(0)
    asyncio.run(body())


def test_a_marker_is_sent_at_once_after_the_frames_before_it():
    async def body():
        router, dealer = await _pair()
        batcher = FrameBatcher(zsock.Tx(dealer))
        batcher.add(3, 7, 0, np.ones(SAMPLES_IN, np.float32))
        assert batcher.end_stream(3, 7)            # flushed now, not at the turn's end
        head, _ = frame_batch.decode(*(await router.recv_multipart())[2:])
        assert head["frame"].tolist() == [0, END_OF_STREAM]
        router.close(0)
        dealer.close(0)
    asyncio.run(body())


def test_frames_of_a_batch_that_cannot_be_sent_are_each_counted():
    async def body():
        router, dealer = await _pair()
        batcher = FrameBatcher(zsock.Tx(dealer))
        lost = []
        for k in range(5):
            batcher.add(1, 1, k, np.zeros(SAMPLES_IN, np.float32), lambda k=k: lost.append(k))
        dealer.close(0)                            # the clock went away
        assert not batcher.flush()
        assert lost == [0, 1, 2, 3, 4]
        router.close(0)
    asyncio.run(body())


def test_parts_that_disagree_are_not_a_batch():
    head = np.zeros(2, frame_batch.HEADER).tobytes()
    assert frame_batch.decode(head, bytes(4 * SAMPLES_IN)) is None
    assert frame_batch.decode(head[:-1], bytes(8 * SAMPLES_IN)) is None
    assert frame_batch.decode(head, bytes(8 * SAMPLES_IN)) is not None
