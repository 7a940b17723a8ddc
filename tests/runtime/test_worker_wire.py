"""The clock → worker beat messages (wave_actors/sessions/worker_wire.py) carrying part of a beat: a
beat's first frame routed while its second computes, then the second. Bugs these catch: a
worker handing a session both frames' tokens with one frame's audio (its text then runs a
frame ahead of its speech), a frame number not shifted to the part sent, and a message whose
parts disagree read as if they matched. And the front → worker direction: clients' audio
shared into one message, never overtaken by control."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
import zmq
import zmq.asyncio

from transports import zsock
from wave_actors.sessions import worker_wire as W
from wave_actors.sessions.messages import AudioIn
from wave_actors.sessions.worker_pool import AUDIO_WAIT_S, WorkerPool, _Worker
from wave_actors.core.frames import ALL_FRAMES, FIRST_FRAME, LATER_FRAMES, SAMPLES_OUT


def _head(frames: slice, rows: int = 3) -> np.ndarray:
    head = np.zeros(rows, W.BEAT_ROW)
    head["rid"] = np.arange(rows) + 10
    head["frame"] = 100 + frames.start
    head["text"] = [[1, 2]] * rows
    head["func"] = [[3, 4]] * rows
    head["user"][:, 0, 0], head["user"][:, 1, 0] = 5, 6
    head["lo"], head["hi"] = frames.start, frames.stop
    return head


@pytest.mark.parametrize("frames,text,user", [(FIRST_FRAME, [1], 5), (LATER_FRAMES, [2], 6),
                                              (ALL_FRAMES, [1, 2], 5)])
def test_a_part_of_a_beat_reads_back_as_its_frames(frames, text, user):
    n = frames.stop - frames.start
    pcm = np.arange(3 * n * SAMPLES_OUT, dtype=np.float32).reshape(3, n, SAMPLES_OUT)
    _kind, head, body = W.beat(_head(frames), pcm)
    rows, got = W.read_beat(head.tobytes(), body.tobytes(), SAMPLES_OUT)
    assert got.shape == (3, n, SAMPLES_OUT) and np.array_equal(got, pcm)
    for i, (rid, h) in enumerate(rows):
        assert rid == 10 + i and h["frame"] == 100 + frames.start
        assert h["text"] == text and len(h["func"]) == len(h["user"]) == n
        assert h["user"][0][0] == user


def test_parts_that_disagree_are_refused():
    head = _head(FIRST_FRAME)
    with pytest.raises(ValueError, match="PCM"):          # two frames of audio for one
        W.read_beat(head.tobytes(), np.zeros((3, 2, SAMPLES_OUT), np.float32).tobytes(),
                    SAMPLES_OUT)
    head["hi"][1] = 2                                     # rows disagree on the frames
    with pytest.raises(ValueError, match="frames"):
        W.read_beat(head.tobytes(), np.zeros((3, 1, SAMPLES_OUT), np.float32).tobytes(),
                    SAMPLES_OUT)
    bad = _head(FIRST_FRAME)
    bad["lo"], bad["hi"] = 1, 1                           # no frame at all
    with pytest.raises(ValueError, match="frames"):
        W.read_beat_at(bad.tobytes(), np.zeros(3, np.int32).tobytes(),
                       np.zeros(1, W.SHARED_AT).tobytes(), b"x")


def test_clients_audio_shares_one_message_to_its_worker_and_control_waits_behind_it():
    """The front → worker direction (worker_pool.WorkerPool), on real sockets with a DEALER
    standing in for the worker. Catches: audio sent a message per client message (an ipc send
    each, the front's largest cost), audio held back past AUDIO_WAIT_S, and a control message
    (a close) overtaking audio its session was sent before it."""
    async def scenario() -> list[list]:
        ctx = zmq.asyncio.Context()
        pool = WorkerPool(1, ctx, (), handlers=None)
        pool.sock = ctx.socket(zmq.ROUTER)
        pool.sock.bind("inproc://pool-audio")
        pool.tx = zsock.Tx(pool.sock)
        stand_in = ctx.socket(zmq.DEALER)
        stand_in.setsockopt(zmq.IDENTITY, b"w0")
        stand_in.connect("inproc://pool-audio")
        await stand_in.send(b"ready")                # the ROUTER knows the identity from here
        assert (await pool.sock.recv_multipart())[0] == b"w0"
        worker = pool.workers[0] = _Worker(0, None, asyncio.get_running_loop().create_future(),
                                           identity=b"w0")
        for seq in range(3):                         # three clients' frames, one at a time
            pool.queue_audio(worker, 7 + seq, AudioIn(seq, b"x" * (seq + 1)))
            await asyncio.sleep(0)
        first = await asyncio.wait_for(stand_in.recv_multipart(), 1.0)
        pool.queue_audio(worker, 7, AudioIn(3, b"y"))
        pool.send(worker, W.ctrl("close", 7, "client"))   # the audio before it goes first
        second = await asyncio.wait_for(stand_in.recv_multipart(), 1.0)
        third = await asyncio.wait_for(stand_in.recv_multipart(), 1.0)
        assert not await stand_in.poll(5 * 1000 * AUDIO_WAIT_S)     # nothing else was sent
        pool.tx.close(0)
        stand_in.close(0)
        ctx.term()
        return [first, second, third]

    first, second, third = asyncio.run(scenario())
    assert first[0] == W.AUDIO and W.read_audio(*first[1:]) == [
        (7, 0, b"x"), (8, 1, b"xx"), (9, 2, b"xxx")]
    assert second[0] == W.AUDIO and W.read_audio(*second[1:]) == [(7, 3, b"y")]
    assert third[0] == W.CTRL and W.read_ctrl(third[1])[:2] == ("close", 7)
