"""Helpers to run a real node (sim backend) in-process on a real TCP socket, with real clients."""
from __future__ import annotations

import asyncio
import contextlib

import msgpack
import numpy as np
import zmq
import zmq.asyncio

from sim.executor import SimExecutor
from transports.client import NodeClient
from wave_actors.core.contract import ExecutorOptions
from wave_actors.core.timebase import Clock
from wave_actors.engine.process import ExecutorSpec
from wave_actors.node.config import NodeConfig
from wave_actors.node.node import Node

FRAME = np.zeros(1280, np.float32).tobytes()        # 80 ms at 16 kHz, pcm_f32le


async def stream(session, n: int, period: float = 0.02) -> None:
    """`n` frames of silence, one every `period` s (0.08: as a caller sends them)."""
    for _ in range(n):
        await session.send_audio(FRAME)
        await asyncio.sleep(period)


@contextlib.asynccontextmanager
async def node_on_tcp(max_sessions=2, backend=None, **cfg):
    cfg.setdefault("drain_grace_s", 0.0)
    clock = Clock()
    if backend is None:
        opts = ExecutorOptions(max_sessions=max_sessions)
        # With session workers the executor lives in the engine process, built there.
        backend = (ExecutorSpec("sim", opts) if cfg.get("workers")
                   else SimExecutor(opts, clock=clock))
    node = Node(NodeConfig(bind="tcp://127.0.0.1:0", max_sessions=max_sessions, **cfg),
                backend, clock)
    await node.start()
    try:
        yield node
    finally:
        await node.drain(timeout=2)


@contextlib.asynccontextmanager
async def client_of(node, **kw):
    async with NodeClient(node.endpoint, **kw) as c:
        yield c


async def raw_dealer(node):
    sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(node.endpoint)
    return sock


async def reply(sock, timeout=3.0):
    frames = await asyncio.wait_for(sock.recv_multipart(), timeout)
    return msgpack.unpackb(frames[0]), frames[1:]


async def events_until(s, pred, timeout=8.0):
    got = []
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        ev = await s.next_event(max(0.01, end - loop.time()))
        got.append(ev)
        if pred(ev, got):
            return got
