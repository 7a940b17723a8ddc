"""What a client of the node sees: the events a session's `next_event` returns, decoded from
the node's messages, and the exceptions of opening and sending (`client.py` does the rest)."""
from __future__ import annotations

from dataclasses import dataclass

from transports import protocol as P


@dataclass
class Audio:
    seq: int
    frame: int
    payload: bytes


@dataclass
class Text:
    channel: str
    frame: int
    text: str


@dataclass
class FunctionCall:
    call_id: str
    name: str
    arguments: str


@dataclass
class Closed:
    stats: dict


@dataclass
class Error:
    code: str
    message: str


class NodeUnavailable(Exception):
    """No node took the message in time (down, unreachable, or it refused our key)."""


class Refused(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason, self.message = reason, message


class FleetUnavailable(RuntimeError):
    """`--fleet ADDRESS` names no Ray cluster, or one where no fleet runs."""


def event_of(msg: P.Message):
    """A node message for a session, as the event its `next_event` returns."""
    h = msg.header
    if msg.type == "audio":
        return Audio(h.get("seq", -1), h.get("frame", -1), msg.payload or b"")
    if msg.type == "text":
        return Text(h.get("channel", "?"), h.get("frame", -1), h.get("text", ""))
    if msg.type == "function_call":
        return FunctionCall(h.get("call_id", ""), h.get("name", ""), h.get("arguments", ""))
    if msg.type == "closed":
        return Closed(h.get("stats", {}))
    return Error(h.get("code", "?"), h.get("message", ""))
