"""What each Realtime client event does to its connection: one handler per event type.

`Connection._on_message` parses an event and calls `HANDLERS[type](connection, event)`; a
handler answers a bad event by raising `EventError` (told to the client, the connection goes on).
The handlers act through the connection's public face: its session config, its node leg
(`open_node`, `send_input`, `send_to_node`) and its outbox (`emit`).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from dataclasses import replace

from transports import client as C
from transports.realtime.session import (NAMED, NATIVE_OUTPUT, EventError, apply_update,
                                         parse_audio_format)
from transports.realtime.views import ConnectionView
from wave_actors.core.tasks import within


log = logging.getLogger("wave.realtime")


async def on_session_update(conn: ConnectionView, event: dict) -> None:
    new = apply_update(conn.session, event.get("session"), opened=conn.node is not None)
    if conn.dialect.vllm_omni and new.output == NAMED["pcm16"]:
        new = replace(new, output=NATIVE_OUTPUT)     # its "pcm16" is the model's rate
    old, conn.session = conn.session, new
    if conn.node is None:
        await conn.open_node()
    else:                            # formats may change mid-session: the bridge converts
        conn.set_converters(new.input != old.input, new.output != old.output)
    conn.emit(conn.conv.event("session.updated", session=conn.session_obj()))


async def on_append(conn: ConnectionView, event: dict) -> None:
    audio = event.get("audio")
    if not isinstance(audio, str) or not audio:
        raise EventError("missing_required_parameter", "input_audio_buffer.append needs "
                         "`audio`: base64 of audio in the session's input format", "audio")
    try:
        data = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise EventError("invalid_value", "`audio` is not valid base64", "audio")
    if "format" in event:          # vllm-omni style: the format travels with each chunk
        spec = parse_audio_format(event["format"], "format")
        rate = event.get("sample_rate_hz", spec.rate)
        spec = parse_audio_format({"type": spec.ga()["type"], "rate": rate}, "sample_rate_hz")
        if spec != conn.session.input:
            conn.session = replace(conn.session, input=spec)
            if conn.node is not None:
                conn.set_converters(input=True, output=False)
    await conn.open_node()
    pieces = conn.to_node.pieces(data)         # validated now; converted as each is sent
    conn.conv.note_input()
    await conn.send_input(pieces)


async def on_commit(conn: ConnectionView, event: dict) -> None:
    if event.get("final") and conn.node is not None:
        tail = conn.to_node.pieces(b"", last=True)  # flush the resampler: end of input
        conn.set_converters(input=True, output=False)
        await conn.send_input(tail)
    events = conn.conv.commit()
    if events is None:
        raise EventError("input_audio_buffer_commit_empty", "no input audio since the last "
                         "commit")
    conn.conv.resume()
    conn.emit(events)


async def on_clear(conn: ConnectionView, event: dict) -> None:
    # What is still queued is dropped (the client asked); audio the model has heard
    # cannot be un-heard.
    conn.bridge.totals["input_cleared_bytes"] += conn.feed.clear()
    conn.emit(conn.conv.event("input_audio_buffer.cleared"))


async def on_item_create(conn: ConnectionView, event: dict) -> None:
    item = event.get("item")
    if not isinstance(item, dict) or item.get("type") != "function_call_output":
        raise EventError("unsupported_item_type", "a full-duplex voice model takes only "
                         "`function_call_output` items; speak to it through "
                         "input_audio_buffer.append", "item.type")
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str) or not call_id or not isinstance(output, str):
        raise EventError("missing_required_parameter", "function_call_output needs string "
                         "`call_id` and `output`", "item")
    if conn.node is None:
        raise EventError("session_not_started", "no session is open yet, so no function "
                         "call can be pending")
    await conn.send_to_node(conn.node.function_result(call_id, output))
    done = {"id": item.get("id") or conn.ids("item"), "object": "realtime.item",
            "type": "function_call_output", "status": "completed", "call_id": call_id,
            "output": output}
    events = conn.conv.event("conversation.item.added", previous_item_id=conn.conv.last_item,
                             item=done)
    conn.conv.last_item = done["id"]
    conn.emit(events + conn.conv.event("conversation.item.done", item=done))


async def on_response_create(conn: ConnectionView, event: dict) -> None:
    params = event.get("response") if isinstance(event.get("response"), dict) else {}
    fixed = {k: params[k] for k in ("instructions", "tools") if params.get(k) is not None}
    if fixed and apply_update(conn.session, fixed, opened=False) != conn.session:
        raise EventError("unsupported_parameter", "response.create cannot change "
                         "instructions or tools: the model speaks on its own clock with the "
                         "session's", "response")
    conn.conv.resume()       # the model is always responding; this only lifts a mute


async def on_response_cancel(conn: ConnectionView, event: dict) -> None:
    conn.emit(conn.conv.cancel())


async def on_unsupported(conn: ConnectionView, event: dict) -> None:
    raise EventError("unsupported_in_duplex", f"{event['type']} is not supported: the model "
                     "keeps its own context, which the client cannot edit or replay",
                     "type")


async def on_session_close(conn: ConnectionView, event: dict) -> None:
    """vllm-omni's `session.close`: the node session ends, `session.closed` with its stats,
    then the WebSocket closes (1000)."""
    if not conn.dialect.vllm_omni:
        raise EventError("unknown_event_type", "unknown event type 'session.close'; close "
                         "the WebSocket to end the session", "type")
    conn.stop_feed()
    stats = None
    if conn.node is not None and conn.node.closed is None:
        try:
            stats = (await within(conn.node.close(timeout=5.0), 5.0)).stats
        except (asyncio.TimeoutError, OSError, C.NodeUnavailable):
            log.warning("%s: node did not confirm close", conn.node_id)
    elif conn.node is not None:
        stats = conn.node.closed.stats
    conn.node_stats = stats
    conn.tell_closed(stats, "closed by the client")
    await conn.close(1000, "session closed")


HANDLERS = {
    "session.update": on_session_update,
    "input_audio_buffer.append": on_append,
    "input_audio_buffer.commit": on_commit,
    "input_audio_buffer.clear": on_clear,
    "conversation.item.create": on_item_create,
    "response.create": on_response_create,
    "response.cancel": on_response_cancel,
    "session.close": on_session_close,
    "conversation.item.truncate": on_unsupported,
    "conversation.item.delete": on_unsupported,
    "conversation.item.retrieve": on_unsupported,
    "output_audio_buffer.clear": on_unsupported,
}
