"""A call through the fleet: placed by the directory, then opened on its node over the node's
own ZeroMQ endpoint (the directory hands out the endpoint; audio never passes through it).
The directory is told when the call ends, or that the node refused it, so its slot is free
again at once. A call whose node died ends here with `error node_lost` and `closed` within
a watch period of the directory hearing of the loss.
"""
from __future__ import annotations

import asyncio

import ray

from transports import protocol as P
from transports.client import NodeClient
from transports.client_session import ClientSession
from wave_actors.core.tasks import stop_tasks
from wave_actors.fleet.directory import FleetFull

WATCH_S = 0.25              # how often the directory is asked which nodes are alive


class FleetCalls:
    """One client per node endpoint, shared by the calls placed there."""

    def __init__(self, directory):
        self.directory = directory
        self.clients: dict[str, NodeClient] = {}
        self.node_of: dict[str, str] = {}
        self._placed: dict[str, tuple[str, int, str]] = {}    # call → node, incarnation, endpoint
        self.lost = 0
        self._watch: asyncio.Task | None = None

    async def _watch_nodes(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            if not self._placed:
                continue
            health = await self.directory.health.remote()
            for call, (node, incarnation, endpoint) in list(self._placed.items()):
                now = health.get(node)
                if now is None or now != (incarnation, True):
                    del self._placed[call]
                    self.node_of.pop(call, None)
                    self.lost += self.clients[endpoint].lose(
                        call, P.NODE_LOST, f"node {node} was lost; its calls cannot go on")

    def _client(self, endpoint: str) -> NodeClient:
        client = self.clients.get(endpoint)
        if client is None:
            client = self.clients[endpoint] = NodeClient(endpoint)
            client.connect()
        return client

    async def open(self, session: str, **fields) -> ClientSession:
        """Raises `FleetFull` when no node can take the call, `Refused` when its node refused
        it (its placement is given back first)."""
        placed = await self.directory.place.remote(session)
        if "refused" in placed:
            raise FleetFull(placed["refused"], placed["message"])
        try:
            opened = await self._client(placed["endpoint"]).open(session, **fields)
        except Exception:                       # refused, or the node did not answer
            await self.directory.give_back.remote(session)
            raise
        self.node_of[session] = placed["node"]
        self._placed[session] = (placed["node"], placed["incarnation"], placed["endpoint"])
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_nodes())
        return opened

    async def close(self, call: ClientSession):
        """The node's `closed` for the call (its stats)."""
        try:
            return await call.close()
        finally:
            self.node_of.pop(call.id, None)
            self._placed.pop(call.id, None)
            await self.directory.closed.remote(call.id)

    async def aclose(self) -> None:
        await stop_tasks([self._watch])
        for client in self.clients.values():
            await client.aclose()
        self.clients.clear()


def directory(address: str | None = None):
    """The running fleet's directory actor (from a process joined to its Ray cluster)."""
    if not ray.is_initialized():
        ray.init(address=address or "auto", log_to_driver=False)
    return ray.get_actor("wave-directory")
