"""Messages to a client leave in the order they were sent, also while it is not reading.

The bug: a message that found the client's pipe full went to a task of its own, and later
messages were tried directly and could pass it (text deltas, `function_call`, even `closed`
before the last `audio`); a client that stopped reading grew those tasks without bound.
Here the node's pipe to the client holds a few messages (`send_hwm`, the DEALER's RCVHWM,
inproc), so a pause fills it at once."""
import asyncio

import msgpack
import numpy as np
import zmq

from tests.nodekit import VirtualNode
from transports import protocol as P
from wave_actors.node import outbound

FRAME = (0.05 * np.ones(1280)).astype(np.float32).tobytes()


def read_all(sock) -> list[tuple[dict, list]]:
    got = []
    while True:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return got
        got.append((msgpack.unpackb(frames[0]), frames[1:]))


def run_paused_reader(pause_s: float, pings_in_pause: int = 20, sessions: int = 1):
    vn = VirtualNode(max_sessions=sessions, send_hwm=2)
    sock = zmq.Context.shadow(vn.node.ctx.underlying).socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVHWM, 2)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(vn.node.cfg.bind)
    got: list[tuple[dict, list]] = []
    names = [f"s{i}" for i in range(sessions)]
    waiting = [0]                        # the most messages the front queued for the client

    async def go():
        for name in names:
            sock.send_multipart(P.pack("open", name, sample_rate=16000, format="pcm_f32le"))
        while sum(h.get("type") == "opened" for h, _ in got) < sessions:
            await asyncio.sleep(0.02)
            got.extend(read_all(sock))
        loop = asyncio.get_running_loop()
        t0, seq, nonce = loop.time(), 0, 0
        pause = (t0 + 1.0, t0 + 1.0 + pause_s)
        while loop.time() < pause[1] + 1.0:
            for name in names:
                sock.send_multipart(P.pack("audio", name, FRAME, seq=seq))
            seq += 1
            if pause[0] <= loop.time() < pause[1] and nonce < pings_in_pause:
                sock.send_multipart(P.pack("ping", names[0], nonce=nonce))
                nonce += 1
            if not pause[0] <= loop.time() < pause[1]:
                got.extend(read_all(sock))
            waiting[0] = max(waiting[0], sum(map(vn.node.out.queued, vn.node.bindings.peers)))
            await asyncio.sleep(0.08)
        for name in names:
            sock.send_multipart(P.pack("close", name))
        end = loop.time() + 5.0
        while sum(h.get("type") == "closed" for h, _ in got) < sessions and loop.time() < end:
            await asyncio.sleep(0.02)
            got.extend(read_all(sock))
        return nonce

    try:
        pinged = vn.run(go())
    finally:
        sock.close(0)
        vn.close()
    assert waiting[0] > 0, "the pause never filled the client's pipe: nothing was tested"
    return got, pinged


def test_a_reader_paused_two_seconds_gets_every_control_message_in_order_and_closed_last():
    got, pinged = run_paused_reader(2.0)
    types = [h["type"] for h, _ in got]
    assert "error" not in types, [h for h, _ in got if h["type"] == "error"]
    pongs = [h["nonce"] for h, _ in got if h["type"] == "pong"]
    assert pinged >= 10 and pongs == list(range(pinged))         # none lost, in order
    session = [(h, f) for h, f in got if h.get("session") == "s0"]
    assert session[-1][0]["type"] == "closed"                       # `closed` last
    seqs = [h["seq"] for h, _ in session if h["type"] == "audio"]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # audio in order
    stats = session[-1][0]["stats"]
    assert stats["frames_out"] == len(seqs)                      # every audio sent arrived
    assert stats["dropped_out"] == seqs[-1] + 1 - len(seqs)      # the rest counted


def test_a_long_pause_sheds_only_audio_and_counts_it():
    """Paused past the queue's audio bound (but not the liveness limit): the oldest audio is
    shed and counted in `dropped_out`; every pong still arrives, in order, and `closed` last."""
    pause = 2.9
    got, pinged = run_paused_reader(pause, pings_in_pause=30, sessions=2)
    pongs = [h["nonce"] for h, _ in got if h["type"] == "pong"]
    assert pongs == list(range(pinged))
    shed_total = 0
    for name in ("s0", "s1"):
        session = [h for h, _ in got if h.get("session") == name]
        assert session[-1]["type"] == "closed"
        seqs = [h["seq"] for h in session if h["type"] == "audio"]
        assert seqs == sorted(seqs)
        stats = session[-1]["stats"]
        assert stats["frames_out"] == len(seqs)
        assert stats["dropped_out"] == seqs[-1] + 1 - len(seqs)
        shed_total += stats["dropped_out"]
    assert shed_total >= 2 * pause / 0.08 - outbound.QUEUED_AUDIO - 8   # the bound held
