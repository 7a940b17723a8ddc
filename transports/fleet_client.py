"""Calls through the fleet (`wave_actors/fleet`), for a bridge or an agent: a drop-in for
`NodeClient` whose `open` asks the fleet's directory actor for a node, then opens the session
on that node over its own ZeroMQ endpoint (the directory hands out the endpoint; audio never
passes through Ray). The directory hears when a call ends (by any side: a watch reads each
call's `closed`; at once for a call ended through `close`) or that its node refused it, so the
slot is free again within a watch period. A call whose
node died ends here with `error node_lost` and `closed` within a watch period of the
directory hearing of the loss. The closes a watch finds go to the directory in one message,
so a busy bridge costs it about one call a placement, not two.
"""
from __future__ import annotations

import asyncio
import os

import ray

from transports import protocol as P
from transports.client import NodeClient
from transports.client_events import FleetUnavailable, Refused
from transports.client_session import ClientSession
from wave_actors.core.tasks import stop_tasks

DIRECTORY = "wave-directory"        # the directory actor's name (`wave_actors/fleet`)
# Named actors are seen only within their Ray namespace: the fleet and every process that joins
# it (bridges, `drain`, a restarted entry point) name the same one; a second fleet on the same
# cluster takes another (`--namespace`, and this variable for its bridges).
NAMESPACE = os.environ.get("WAVE_FLEET_NAMESPACE", "wave")
WATCH_S = 0.25              # how often calls are checked: ended, or their node lost


class FleetClient:
    """One `NodeClient` per node endpoint, shared by the calls placed there."""

    def __init__(self, directory, curve=None):
        self.directory, self.curve = directory, curve
        self.clients: dict[str, NodeClient] = {}
        self.node_of: dict[str, str] = {}
        self._placed: dict[str, tuple[str, int, str]] = {}    # call → node, incarnation, endpoint
        self.lost = 0
        self._watch: asyncio.Task | None = None
        self._to_place: list[tuple[str, asyncio.Future]] = []
        self.place_messages = 0             # `place_many` messages sent (a burst shares one)
        self._placer: asyncio.Task | None = None

    @classmethod
    def join(cls, address: str | None = None, curve=None) -> "FleetClient":
        """The running fleet's client, from a process that joins its Ray cluster."""
        address = address or "auto"
        try:
            if not ray.is_initialized():
                ray.init(address=address, log_to_driver=False)
        except ConnectionError:
            raise FleetUnavailable(f"--fleet {address}: no Ray cluster answers there") from None
        try:
            return cls(ray.get_actor(DIRECTORY, namespace=NAMESPACE), curve)
        except ValueError:
            raise FleetUnavailable(
                f"--fleet {address}: no fleet runs on that Ray cluster (namespace "
                f"{NAMESPACE!r}); start one: python -m wave_actors.fleet --address "
                f"{address} -- NODE_ARGS") from None

    def connect(self) -> None:
        """Nothing to do: a node's client connects when a call is first placed there."""

    async def _watch_calls(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            if not self._placed:
                continue
            try:
                health = await self.directory.health.remote()
            except ray.exceptions.RayError:     # the directory gone for good: calls go on
                continue
            nodes, ended = health["nodes"], []
            for call, (node, incarnation, endpoint) in list(self._placed.items()):
                client = self.clients[endpoint]
                session = client.sessions.get(call)
                if session is None or session.closed is not None:     # ended, by either side
                    self._forget(call)
                    ended.append(call)
                elif node not in nodes and health["restoring"]:
                    continue                    # a restarted directory not yet told of it
                elif nodes.get(node) != (incarnation, True):
                    self._forget(call)
                    self.lost += client.lose(call, P.NODE_LOST,
                                             f"node {node} was lost; its calls cannot go on")
            if ended:               # one message for the period's closes: the directory's load
                try:
                    await self.directory.closed_many.remote(ended)
                except ray.exceptions.RayError:
                    pass                # gone for good; a restarted one learns from the nodes

    def _forget(self, call: str) -> None:
        self._placed.pop(call, None)
        self.node_of.pop(call, None)

    def _client(self, endpoint: str) -> NodeClient:
        client = self.clients.get(endpoint)
        if client is None:
            client = self.clients[endpoint] = NodeClient(endpoint, curve=self.curve)
            client.connect()
        return client

    async def open(self, session: str, **fields) -> ClientSession:
        """`NodeClient.open` through the fleet: raises `Refused` (`capacity` when no node can
        take the call) as a node would, its placement given back first."""
        placed = await self.place(session)
        if "refused" in placed:
            raise Refused("capacity" if placed["refused"] == "capacity" else "draining",
                          placed["message"])
        try:
            opened = await self._client(placed["endpoint"]).open(session, **fields)
        except BaseException:       # refused, the node did not answer, or the open was cancelled
            await self.directory.give_back.remote(session)
            raise
        self._hold(session, placed)
        return opened

    def _hold(self, session: str, placed: dict) -> None:
        """A live call of this client on its placed node: watched from now on."""
        self.node_of[session] = placed["node"]
        self._placed[session] = (placed["node"], placed["incarnation"], placed["endpoint"])
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_calls())

    async def attach(self, session: str, token: str, timeout: float = 10.0) -> ClientSession:
        """`NodeClient.attach` through the fleet: the directory says which node holds the
        call (a call stays on its node for life), and this client takes it over there by its
        token. Raises `Refused` ("unknown") where the fleet holds no such call."""
        placed = await self.directory.locate.remote(session)
        if placed is None:
            raise Refused("unknown", f"{session}: no node of the fleet holds this call")
        attached = await self._client(placed["endpoint"]).attach(session, token, timeout)
        if attached.closed is None:
            self._hold(session, placed)
        return attached

    async def place(self, session: str) -> dict:
        """The directory's placement for `session` (its slot counted; `open` uses it). Placements asked while one message is in
        flight go together in the next (`place_many`): none waits when the bridge is quiet,
        and a burst costs the directory a message a round trip, not one a call."""
        loop = asyncio.get_running_loop()
        placed = loop.create_future()
        self._to_place.append((session, placed))
        if self._placer is None or self._placer.done():
            self._placer = loop.create_task(self._place_queued())
        return await placed

    async def _place_queued(self) -> None:
        while self._to_place:
            batch, self._to_place = self._to_place, []
            self.place_messages += 1
            try:
                results = await self.directory.place_many.remote([s for s, _ in batch])
            except asyncio.CancelledError:      # the client closing: no open waits on
                for _, waiting in batch + self._to_place:
                    waiting.cancel()
                raise
            except Exception as exc:
                for _, waiting in batch:
                    if not waiting.done():
                        waiting.set_exception(exc)
                continue
            for (session, waiting), placed in zip(batch, results):
                if not waiting.done():
                    waiting.set_result(placed)
                elif "refused" not in placed:       # its open was cancelled meanwhile
                    await self.directory.give_back.remote(session)

    async def close(self, call: ClientSession):
        """The node's `closed` for the call (its stats); the directory told at once."""
        try:
            return await call.close()
        finally:
            self._forget(call.id)
            await self.directory.closed.remote(call.id)

    async def aclose(self) -> None:
        await stop_tasks([self._watch, self._placer])
        for client in self.clients.values():
            await client.aclose()
        self.clients.clear()
