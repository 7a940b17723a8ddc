"""Every event the Realtime bridge sends, in both dialects, validates against the `openai` SDK's
own pydantic models of server events.

A scripted session drives each dialect through what a client does: session updates (with
tools), audio appends and a commit, a user text item, response.create and response.cancel,
input_audio_buffer.clear, an unsupported event, a malformed one, and finally the node
closing the session. Bugs caught: a content part of a type the SDK does not know
(`output_audio`), `usage` missing on a finished input transcription, a status reason that is
not an API value (`session_closed`), an event the SDK does not know sent to a client that did
not ask for it (`session.closed`), and a session object the beta models reject.

Real parts: the node is a subprocess (sim backend); the bridge runs in-process; the client is
a real `websockets` connection. Every wait is bounded.
"""
from __future__ import annotations

import asyncio
import base64
import collections
import json
import signal

import pytest
from websockets.asyncio.client import connect

from tests.transports.realtime_models import problems
from tests.transports.realtimekit import FRAME_S, start_node, stop, tone
from transports.realtime.server import Bridge, BridgeConfig

TOOL = {"type": "function", "name": "lookup_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def script(dialect: str) -> list:
    """(client event or a pause in seconds), in order."""
    if dialect == "ga":
        update = {"type": "realtime", "instructions": "be brief", "tools": [TOOL],
                  "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}}
    else:
        update = {"instructions": "be brief", "tools": [TOOL], "input_audio_format": "pcm16"}
    pcm = base64.b64encode(tone("pcm_s16le", 24000, FRAME_S)).decode()
    steps: list = [{"type": "session.update", "session": update}]
    for _ in range(30):
        steps += [{"type": "input_audio_buffer.append", "audio": pcm}, FRAME_S]
    steps += [{"type": "input_audio_buffer.commit"},
              {"type": "conversation.item.create", "item": {
                  "type": "message", "role": "user",
                  "content": [{"type": "input_text", "text": "hello"}]}},
              {"type": "response.create"}, 1.0,
              {"type": "response.cancel"},
              {"type": "input_audio_buffer.clear"},
              {"type": "conversation.item.delete", "item_id": "item_none"},
              {"type": "no.such.event"}, "{not json", 1.0]
    return steps


@pytest.mark.slow
@pytest.mark.parametrize("dialect", ["ga", "beta"])
def test_every_server_event_validates_against_the_sdks_models(tmp_path, dialect):
    proc, endpoint = start_node(tmp_path)
    seen: collections.Counter = collections.Counter()
    bad: dict[str, str] = {}

    async def go():
        bridge = await Bridge(BridgeConfig(node=endpoint, port=0)).start()
        query = "" if dialect == "ga" else "?dialect=beta"
        try:
            async with connect(f"ws://127.0.0.1:{bridge.port}/v1/realtime{query}") as ws:
                async def reader():
                    async for text in ws:
                        ev = json.loads(text)
                        seen[ev["type"]] += 1
                        why = problems(ev, dialect)
                        if why:
                            bad.setdefault(ev["type"], why[:800])
                task = asyncio.create_task(reader())
                for step in script(dialect):
                    if isinstance(step, float):
                        await asyncio.sleep(step)
                    else:
                        await ws.send(step if isinstance(step, str) else json.dumps(step))
                proc.send_signal(signal.SIGTERM)        # the node drains: it closes the session
                await asyncio.wait_for(task, 15)
            assert ws.close_code == 1000
        finally:
            await bridge.stop()
    try:
        asyncio.run(asyncio.wait_for(go(), 60))
    finally:
        stop(proc)
    assert not bad, "\n".join(f"{k}: {v}" for k, v in bad.items())
    delta = "response.output_audio.delta" if dialect == "ga" else "response.audio.delta"
    # the script reached every kind of event it is there to check
    for kind in ("session.created", "session.updated", "response.created", "response.done",
                 delta, "input_audio_buffer.committed", "input_audio_buffer.cleared",
                 "conversation.item.input_audio_transcription.completed", "error"):
        assert seen[kind], (kind, dict(seen))
