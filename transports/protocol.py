"""The node's wire protocol, version 1 (PROTOCOL.md): message schemas, validation, framing.

A message is multipart `[msgpack header, optional raw payload]`. `parse` turns raw frames from
the network into a `Message` or raises `ProtocolError` with the stable error code the node sends
back; `pack` does the reverse. Both sides (node, bridges, clients) use this one module.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgpack

VERSION = 1
MAX_HEADER_BYTES = 64 * 1024
MAX_PAYLOAD_BYTES = 1 << 20          # 1 MiB of audio in one message is ~5 s of 48 kHz f32
# The transport's own guard against memory exhaustion: a frame past this makes ZMQ drop the
# connection (nothing can be answered). Between the protocol limits above and this one, a
# message is read and answered `too_large`; the connection and its sessions live on.
TRANSPORT_MAX_BYTES = 64 << 20
TOKEN_BYTES = 16                     # a resume token's entropy (sent as 32 hex chars)
MAX_INSTRUCTIONS = 32 * 1024
MAX_TOOLS = 16
SESSION_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

SAMPLE_RATES = (8000, 16000, 22050, 24000, 48000)
FORMATS = ("pcm_s16le", "pcm_f32le", "pcmu", "pcma")
BYTES_PER_SAMPLE = {"pcm_s16le": 2, "pcm_f32le": 4, "pcmu": 1, "pcma": 1}

CLIENT_TYPES = ("open", "audio", "function_result", "event", "close", "ping", "resume")
# `event`: something that happened on the client's side that the model should see, by name,
# with the values each name takes (a phone's key press: RFC 4733's sixteen keys)
EVENT_VALUES = {"dtmf": tuple("0123456789*#ABCD")}
NODE_TYPES = ("opened", "refused", "audio", "text", "function_call", "closed", "error", "pong",
              "resumed", "heartbeat")
REFUSE_REASONS = ("capacity", "admission", "duplicate", "invalid", "unauthorized", "draining")

# Stable error codes (the `code` field of `error`).
BAD_MSGPACK = "bad_msgpack"
BAD_HEADER = "bad_header"
BAD_VERSION = "bad_version"
UNKNOWN_TYPE = "unknown_type"
UNKNOWN_SESSION = "unknown_session"
BAD_PAYLOAD = "bad_payload"
BAD_SEQ = "bad_seq"
TOO_LARGE = "too_large"
FORBIDDEN = "forbidden"
OVERLOADED = "overloaded"
INTERNAL = "internal"
INPUT_OVERFLOW = "input_overflow"    # a session's input is past its backlog's bound
DETACHED = "detached"                # the session is bound to another connection: resume it
# Never sent by a node: a fleet client's word for a session whose node died (its state was on
# that node's GPU; the caller redials), given with a `closed` of the same reason.
NODE_LOST = "node_lost"


class ProtocolError(Exception):
    """Input that breaks the protocol; `code` goes on the wire, `session` when it is known."""

    def __init__(self, code: str, message: str, session: str | None = None,
                 msg_type: str | None = None):
        super().__init__(message)
        self.code, self.message, self.session = code, message, session
        self.msg_type = msg_type            # the message's type, where it was readable


@dataclass
class Message:
    type: str
    session: str | None = None
    header: dict[str, Any] = field(default_factory=dict)
    payload: bytes | None = None

    def get(self, key: str, default: Any = None) -> Any:
        return self.header.get(key, default)


def pack(type_: str, session: str | None = None, payload: bytes | None = None,
         **fields: Any) -> list[bytes]:
    """Frames for one message; `fields` become header fields."""
    header = {"v": VERSION, "type": type_}
    if session is not None:
        header["session"] = session
    header.update(fields)
    frames = [msgpack.packb(header, use_bin_type=True)]
    if payload is not None:
        frames.append(bytes(payload))
    return frames


def error_frames(code: str, message: str, session: str | None = None) -> list[bytes]:
    return pack("error", session, code=code, message=message)


def parse(frames: list[bytes], types: tuple[str, ...] = CLIENT_TYPES) -> Message:
    """Validate raw frames from the network against the schema of `types`."""
    if not frames or len(frames) > 2:
        raise ProtocolError(BAD_HEADER, f"expected 1 or 2 frames, got {len(frames)}")
    raw = frames[0]
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(TOO_LARGE, f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises many types for broken input
        raise ProtocolError(BAD_MSGPACK, f"header is not valid msgpack: {type(exc).__name__}")
    if not isinstance(header, dict):
        raise ProtocolError(BAD_HEADER, "header must be a msgpack map")
    session = header.get("session")
    if session is not None and not (isinstance(session, str) and SESSION_RE.fullmatch(session)):
        raise ProtocolError(BAD_HEADER, "session must be 1-64 chars of A-Za-z0-9_.-")
    version = header.get("v")
    if type(version) is not int or version != VERSION:     # not True, 1.0 or "1"
        raise ProtocolError(BAD_VERSION, f"protocol version must be {VERSION}", session)
    type_ = header.get("type")
    if type_ not in types:
        raise ProtocolError(UNKNOWN_TYPE, f"unknown message type {type_!r}", session)
    payload = frames[1] if len(frames) == 2 else None
    if payload is not None and len(payload) > MAX_PAYLOAD_BYTES:
        raise ProtocolError(TOO_LARGE, f"payload of {len(payload)} bytes exceeds "
                                       f"{MAX_PAYLOAD_BYTES}", session)
    msg = Message(type_, session, header, payload)
    try:
        _CHECKS.get(type_, _no_check)(msg)
    except ProtocolError as exc:
        exc.msg_type = type_
        raise
    return msg


def _need(msg: Message, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = msg.header.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ProtocolError(BAD_HEADER, f"{msg.type}: field {key!r} must be {what}", msg.session)
    return value


def _need_session(msg: Message) -> None:
    if msg.session is None:
        raise ProtocolError(BAD_HEADER, f"{msg.type}: field 'session' is required")


def _no_payload(msg: Message) -> None:
    if msg.payload is not None:
        raise ProtocolError(BAD_PAYLOAD, f"{msg.type} takes no payload", msg.session)


def _no_check(msg: Message) -> None:
    pass


def _check_open(msg: Message) -> None:
    _need_session(msg)
    _no_payload(msg)
    if _need(msg, "sample_rate", int, "an int") not in SAMPLE_RATES:
        raise ProtocolError(BAD_HEADER, f"open: sample_rate must be one of {SAMPLE_RATES}",
                            msg.session)
    if _need(msg, "format", str, "a str") not in FORMATS:
        raise ProtocolError(BAD_HEADER, f"open: format must be one of {FORMATS}", msg.session)
    out_rate = msg.header.setdefault("output_sample_rate", 22050)
    if not isinstance(out_rate, int) or isinstance(out_rate, bool) or out_rate not in SAMPLE_RATES:
        raise ProtocolError(BAD_HEADER, f"open: output_sample_rate must be one of {SAMPLE_RATES}",
                            msg.session)
    if msg.header.setdefault("output_format", "pcm_s16le") not in FORMATS:
        raise ProtocolError(BAD_HEADER, f"open: output_format must be one of {FORMATS}",
                            msg.session)
    check_prompt_fields(msg.header, msg.session)


def check_prompt_fields(header: dict, session: str | None = None) -> None:
    """An `open`'s `instructions` and `tools` (defaults set where absent), as the node takes
    them; its warm prompts are checked by the same rule."""
    instructions = header.setdefault("instructions", "")
    if not isinstance(instructions, str) or len(instructions) > MAX_INSTRUCTIONS:
        raise ProtocolError(BAD_HEADER, f"open: instructions must be a str of at most "
                                        f"{MAX_INSTRUCTIONS} chars", session)
    tools = header.setdefault("tools", [])
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS or not all(
            isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools):
        raise ProtocolError(BAD_HEADER, f"open: tools must be a list of at most {MAX_TOOLS} maps "
                                        "with a str 'name'", session)


def _check_audio(msg: Message) -> None:
    _need_session(msg)
    seq = _need(msg, "seq", int, "an int")
    if seq < 0 or seq >= 1 << 63:
        raise ProtocolError(BAD_SEQ, "audio: seq must be a non-negative int64", msg.session)
    if not msg.payload:
        raise ProtocolError(BAD_PAYLOAD, "audio: a payload of at least one sample is required",
                            msg.session)


def _check_function_result(msg: Message) -> None:
    _need_session(msg)
    _no_payload(msg)
    _need(msg, "call_id", str, "a str")
    _need(msg, "output", str, "a str")
    if len(msg.header["output"]) > MAX_INSTRUCTIONS:
        raise ProtocolError(TOO_LARGE, "function_result: output is too long", msg.session)


def _check_event(msg: Message) -> None:
    _need_session(msg)
    _no_payload(msg)
    name = _need(msg, "name", str, "a str")
    if name not in EVENT_VALUES:
        raise ProtocolError(BAD_HEADER, f"event: name must be one of {sorted(EVENT_VALUES)}",
                            msg.session)
    if _need(msg, "value", str, "a str") not in EVENT_VALUES[name]:
        raise ProtocolError(BAD_HEADER, f"event: a {name} value is one of "
                                        f"{''.join(EVENT_VALUES[name])}", msg.session)


def _check_close(msg: Message) -> None:
    _need_session(msg)
    _no_payload(msg)


def _check_ping(msg: Message) -> None:
    _no_payload(msg)


def _check_resume(msg: Message) -> None:
    _need_session(msg)
    _no_payload(msg)
    token = msg.header.get("token")
    if token is not None and not (isinstance(token, str) and len(token) <= 2 * TOKEN_BYTES):
        raise ProtocolError(BAD_HEADER, f"resume: token must be a str of at most "
                                        f"{2 * TOKEN_BYTES} chars", msg.session)


_CHECKS = {"open": _check_open, "audio": _check_audio,
           "function_result": _check_function_result, "event": _check_event,
           "close": _check_close,
           "ping": _check_ping, "resume": _check_resume}
