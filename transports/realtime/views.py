"""What a connection reads of its bridge, and what the client-event handlers read of their
connection, as protocols: each part depends on what it reads, not on the module that holds it
(`server.py` makes connections; `connection.py` calls the handlers).
"""
from __future__ import annotations

from typing import Any, Protocol

from transports import client as C
from transports.realtime.codec import Converter
from transports.realtime.config import BridgeConfig
from transports.realtime.conversation import Conversation, Ids
from transports.realtime.dialect import Dialect
from transports.realtime.feed import InputFeed
from transports.realtime.session import SessionConfig


class BridgeView(Protocol):
    cfg: BridgeConfig
    client: C.NodeClient | None
    connections: set                  # the live connections
    named: dict[str, Any]             # vllm-omni sessions by id: live and parked connections
    totals: dict[str, int]            # the bridge's counters


class ConnectionView(Protocol):
    bridge: BridgeView
    ids: Ids
    node_id: str
    dialect: Dialect
    conv: Conversation
    session: SessionConfig
    node: C.ClientSession | None      # the node session, once opened
    node_stats: dict | None
    to_node: Converter | None
    feed: InputFeed

    def emit(self, events: list[dict]) -> None: ...

    def session_obj(self) -> dict: ...

    async def open_node(self) -> None: ...

    def set_converters(self, input: bool = True, output: bool = True) -> None: ...

    async def send_input(self, pieces) -> None: ...

    def stop_feed(self) -> None: ...

    async def send_to_node(self, send) -> None: ...

    def tell_closed(self, stats: dict | None, reason: str) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...
