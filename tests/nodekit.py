"""Helpers to run a real node (sim backend) in-process on virtual time over inproc ZMQ."""
from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.costmodel import CostModel
from sim.executor import SimExecutor
from transports.client import NodeClient
from wave_actors.core.sched.clock_policy import ClockPolicy
from wave_actors.core.contract import ExecutorOptions
from wave_actors.core.timebase import Clock, VirtualTimeLoop
from wave_actors.engine.process import ExecutorSpec
from wave_actors.node.config import NodeConfig
from wave_actors.node.node import Node

_ids = itertools.count()
SCALE = float(2 ** 24)          # frame codes are integers / 2^24: exact in float32


@dataclass(frozen=True)
class TracingSimSpec(ExecutorSpec):
    """A sim executor that records what it was handed (`SimExecutor.trace`), built in an engine
    process: read it there with `EngineHost.call("trace")`."""

    def build(self):
        return SimExecutor(self.options, trace=True)


def frame_code(session_no: int, frame_no: int) -> float:
    return (session_no * 10_000 + frame_no) / SCALE


def decode_code(value: float) -> tuple[int, int]:
    code = int(round(value * SCALE))
    return code // 10_000, code % 10_000


def coded_frame(session_no: int, frame_no: int) -> bytes:
    return np.full(1280, frame_code(session_no, frame_no), np.float32).tobytes()


def slow_cost(tmp: Path, per_session_ms: float) -> CostModel:
    """A cost model where each session costs `per_session_ms` per beat (no fixed cost)."""
    raw = json.loads((Path(__file__).parents[1] / "sim" / "costmodel.json").read_text())
    raw["weight_bytes_per_frame"] = 0.0
    raw["overhead_s_per_beat"] = 0.0
    raw["bandwidth_Bps"] = 1e12
    prof = raw["profiles"]["reference"]
    prof["fixed_bytes"] = per_session_ms * 1e-3 * 1e12 / 2
    prof["bytes_per_context_frame"] = 0.0
    path = tmp / f"cost-{next(_ids)}.json"
    path.write_text(json.dumps(raw))
    return CostModel.load(path)


class VirtualNode:
    """A node + one client on a VirtualTimeLoop; `run(coro)` drives the loop."""

    def __init__(self, max_sessions: int = 3, cost: CostModel | None = None,
                 executor: type[SimExecutor] = SimExecutor, prebuffer: int | None = None,
                 max_queue: int | None = None, snapshot_mb: float = -1.0, **cfg):
        self.loop = VirtualTimeLoop()
        asyncio.set_event_loop(self.loop)
        self.clock = Clock(self.loop)
        self.executor = executor(ExecutorOptions(max_sessions=max_sessions,
                                                 snapshot_mb=snapshot_mb),
                                 cost or CostModel.load(), self.clock, trace=True)
        bind = f"inproc://node-{next(_ids)}"
        jitter = {k: v for k, v in (("prebuffer", prebuffer), ("max_queue", max_queue)) if v}
        if jitter:
            cfg["clock_policy"] = ClockPolicy(**jitter)
        self.node = Node(NodeConfig(bind=bind, max_sessions=max_sessions, **cfg), self.executor,
                         self.clock)
        self.run(self.node.start())
        self.client = NodeClient(bind, ctx=self.node.ctx)
        self.run(self._connect())

    async def _connect(self):
        self.client.connect()

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def settle(self, seconds: float = 0.001):
        self.run(asyncio.sleep(seconds))

    def close(self):
        self.run(self.client.aclose())
        self.run(self.node.drain(timeout=2.0))
        self.node.ctx.destroy(linger=0)
        self.loop.close()
        asyncio.set_event_loop(None)
