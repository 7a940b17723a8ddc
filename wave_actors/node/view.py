"""What the front's two halves (`inbound.py`, `outbound.py`) read of the node that holds
them, as a protocol: they depend on what they read, not on `node.py`, which wires them.
"""
from __future__ import annotations

import asyncio
from typing import Any, Protocol

import zmq.asyncio

from transports import zsock
from wave_actors.clock.clock import BeatClockActor
from wave_actors.core.contract import Handle
from wave_actors.core.timebase import Clock
from wave_actors.node.bindings import Bindings, Route
from wave_actors.node.config import NodeConfig, NodeCounters
from wave_actors.runtime.metrics import NodeMetrics
from wave_actors.sessions.hosts import SessionHost


class NodeView(Protocol):
    cfg: NodeConfig
    clock: Clock
    bindings: Bindings
    counters: NodeCounters
    metrics: NodeMetrics
    host: SessionHost
    sock: zmq.asyncio.Socket | None   # the public ROUTER, once started
    tx: zsock.Tx                      # sends on `sock`
    out: Any                          # the node's `Outbound`: every send to a client
    draining: bool
    opens: set[asyncio.Task]          # opens in flight

    @property
    def clock_actor(self) -> BeatClockActor: ...

    @property
    def routes(self) -> dict[tuple[bytes, str], Route]: ...

    async def free_slot(self, handle: Handle, stream_ended: bool = False): ...

    def spawn(self, coro) -> asyncio.Task: ...

    def update_gauges(self) -> None: ...
