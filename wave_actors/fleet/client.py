"""A call through the fleet: placed by the directory, then opened on its node over the node's
own ZeroMQ endpoint (the directory hands out the endpoint; audio never passes through it).
The directory is told when the call ends, or that the node refused it, so its slot is free
again at once.
"""
from __future__ import annotations

import ray

from transports.client import NodeClient
from transports.client_session import ClientSession
from wave_actors.fleet.directory import FleetFull


class FleetCalls:
    """One client per node endpoint, shared by the calls placed there."""

    def __init__(self, directory):
        self.directory = directory
        self.clients: dict[str, NodeClient] = {}
        self.node_of: dict[str, str] = {}

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
        return opened

    async def close(self, call: ClientSession) -> None:
        try:
            await call.close()
        finally:
            self.node_of.pop(call.id, None)
            await self.directory.closed.remote(call.id)

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()
        self.clients.clear()


def directory(address: str | None = None):
    """The running fleet's directory actor (from a process joined to its Ray cluster)."""
    if not ray.is_initialized():
        ray.init(address=address or "auto", log_to_driver=False)
    return ray.get_actor("wave-directory")
