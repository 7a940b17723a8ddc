"""End to end: real Realtime clients (websockets, the openai SDK) -> the bridge -> the real node.

The node (`python -m wave_actors.node --backend sim`) and the bridge (`python -m
transports.realtime`) run as subprocesses on free ports; the slow-reader and CURVE tests run a
bridge in-process so they can shrink its limits and read its counters. Every wait is bounded.
"""
import asyncio
import signal
import base64
import json
import socket
import time

import numpy as np
import pytest
from websockets.protocol import State
import zmq.auth
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from transports.client import CurveKeys
from transports.realtime.__main__ import load_z85, parse_args
from transports.realtime.server import Bridge, BridgeConfig

from tests.transports.realtimekit import (FRAME_S, KEY, free_port, recv_json, start, start_node,
                                          stop, tone, until)

@pytest.fixture(scope="module")
def node(tmp_path_factory):
    proc, endpoint = start_node(tmp_path_factory.mktemp("node"))
    yield endpoint
    stop(proc)


@pytest.fixture(scope="module")
def bridge_url(node, tmp_path_factory):
    port = free_port()
    proc = start(["-m", "transports.realtime", "--node", node, "--listen", f"127.0.0.1:{port}"],
                 "listening on", tmp_path_factory.mktemp("bridge") / "bridge.log",
                 env={"WAVE_API_KEY": KEY})
    yield f"ws://127.0.0.1:{port}/v1/realtime"
    stop(proc)


# ---- streaming in every input format ----------------------------------------------------

CASES = [  # (query, session.update's session, wire format, rate, output bytes per 80 ms)
    ("", {"instructions": "You are terse.", "input_audio_format": "pcm16",
          "tools": [{"type": "function", "name": "f", "description": "d",
                     "parameters": {"type": "object", "properties": {}}}]},
     "pcm_s16le", 24000, 3840),
    (f"?api_key={KEY}", {"type": "realtime", "audio": {
        "input": {"format": {"type": "audio/pcm_f32le", "rate": 16000}},
        "output": {"format": {"type": "audio/pcm", "rate": 22050}}}},
     "pcm_f32le", 16000, 3528),
    ("?dialect=beta", {"input_audio_format": "g711_ulaw", "voice": "alloy",
                       "modalities": ["audio", "text"], "turn_detection": None},
     "pcmu", 8000, 3840),
    ("", {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcma"}}}},
     "pcma", 8000, 3840),
]


async def one_session(url: str, query: str, session: dict, fmt: str, rate: int) -> list[dict]:
    headers = {} if "api_key" in query else {"Authorization": f"Bearer {KEY}"}
    events: list[dict] = []
    async with connect(url + query, additional_headers=headers, open_timeout=5) as ws:
        created = await recv_json(ws)
        assert created["type"] == "session.created"
        caps = created["session"]["capabilities"]
        assert caps["implementation_level"] == "model_native_duplex"
        assert caps["chunk_period_ms"] == 80 and caps["supports_multi_session"] is True
        await ws.send(json.dumps({"type": "session.update", "event_id": "up1",
                                  "session": session}))
        events.append(await until(ws, "session.updated", 10, events))
        audio = tone(fmt, rate, 2.0)
        step = len(audio) // 25

        async def feed():
            for i in range(25):
                chunk = base64.b64encode(audio[i * step:(i + 1) * step]).decode()
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
                await asyncio.sleep(FRAME_S)
            await ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c1"}))

        feeder = asyncio.create_task(feed())
        want_call = "tools" in session
        deadline = asyncio.get_running_loop().time() + 15
        while asyncio.get_running_loop().time() < deadline:
            ev = await recv_json(ws, 5)
            events.append(ev)
            if ev["type"] == "response.function_call_arguments.done":
                await ws.send(json.dumps({"type": "conversation.item.create", "event_id": "fo1",
                                          "item": {"type": "function_call_output",
                                                   "call_id": ev["call_id"],
                                                   "output": '{"ok": true}'}}))
            types = {e["type"] for e in events}
            done_call = any(e["type"] == "conversation.item.added" and
                            e["item"]["type"] == "function_call_output" for e in events)
            committed = "input_audio_buffer.committed" in types and \
                "conversation.item.input_audio_transcription.completed" in types
            if feeder.done() and committed and \
                    sum(e["type"].endswith("audio.delta") for e in events) >= 20 and \
                    (done_call or not want_call):
                break
        await feeder
    return events


def check_session(events: list[dict], query: str, session: dict, frame_bytes: int) -> None:
    types = [e["type"] for e in events]
    assert "error" not in types, [e for e in events if e["type"] == "error"]
    assert all(e.get("event_id") for e in events)
    beta = "beta" in query
    delta_name = "response.audio.delta" if beta else "response.output_audio.delta"
    other = "response.output_audio.delta" if beta else "response.audio.delta"
    assert other not in types
    sizes = [len(base64.b64decode(e["delta"])) for e in events if e["type"] == delta_name]
    assert len(sizes) >= 20
    if frame_bytes == 3528:                       # native rate: the node's frames, untouched
        assert set(sizes) == {3528}
    else:                                         # 24 kHz via soxr: blocky, same rate overall
        assert all(s % 2 == 0 for s in sizes)
        assert abs(np.mean(sizes) / frame_bytes - 1) < 0.05
    transcript = "response.audio_transcript.delta" if beta else \
        "response.output_audio_transcript.delta"
    assert transcript in types
    assert "conversation.item.input_audio_transcription.delta" in types
    assert "input_audio_buffer.committed" in types
    assert "conversation.item.input_audio_transcription.completed" in types
    if "tools" in session:
        call = next(e for e in events if e["type"] == "response.output_item.done"
                    and e["item"]["type"] == "function_call")
        args = next(e for e in events if e["type"] == "response.function_call_arguments.done")
        assert call["item"]["call_id"] == args["call_id"] and args["name"] == "f"
        json.loads(args["arguments"])
        after = types[types.index("response.function_call_arguments.done"):]
        assert "response.done" in after


@pytest.mark.slow
def test_stream_every_input_format_concurrently(bridge_url):
    """Four sessions at once, one per input format (two output rates, both dialects, three ways
    to authenticate): audio and both transcripts come back; a function call round-trips."""
    async def go():
        return await asyncio.wait_for(asyncio.gather(
            *(one_session(bridge_url, q, s, fmt, rate) for q, s, fmt, rate, _ in CASES)), 40)
    results = asyncio.run(go())
    for (query, session, _, _, frame_bytes), events in zip(CASES, results):
        check_session(events, query, session, frame_bytes)


# ---- abuse: bad events are answered, the connection stays usable ------------------------

def test_bad_events_get_errors_and_connection_stays_usable(bridge_url):
    async def go():
        ws = await connect(bridge_url, additional_headers={"Authorization": f"Bearer {KEY}"},
                           max_size=None)
        try:
            await abuse(ws)
        finally:
            # The server ends with 1009; closing an already aborted socket again can trip
            # asyncio's transport teardown (its loop is gone), which is not what is tested.
            if ws.state is not State.CLOSED:
                await ws.close()

    async def abuse(ws):
        await until(ws, "session.created")

        async def expect(payload, code, event_id=None):
            await ws.send(payload)
            ev = await until(ws, "error")
            assert ev["error"]["code"] == code, ev
            assert ev["error"]["event_id"] == event_id and ev["event_id"]
            assert ev["error"]["message"]

        await expect("{not json", "invalid_json")
        await expect(json.dumps([1, 2]), "invalid_event")
        await expect(b"\x00\x01", "invalid_event")
        await expect(json.dumps({"type": "nope.nothing", "event_id": "u1"}),
                     "unknown_event_type", "u1")
        await expect(json.dumps({"type": "input_audio_buffer.append", "event_id": "big",
                                 "audio": "A" * (1 << 20)}), "message_too_large")
        await expect(json.dumps({"type": "input_audio_buffer.append", "event_id": "b64",
                                 "audio": "not base64!!"}), "invalid_value", "b64")
        await expect(json.dumps({"type": "conversation.item.create", "event_id": "msg",
                                 "item": {"type": "message", "role": "user", "content": []}}),
                     "unsupported_item_type", "msg")
        await ws.send(json.dumps({"type": "session.update", "event_id": "s1",
                                  "session": {"instructions": "one"}}))
        await until(ws, "session.updated", 10)
        await expect(json.dumps({"type": "session.update", "event_id": "s2",
                                 "session": {"instructions": "two"}}),
                     "immutable_session_field", "s2")
        await expect(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c0"}),
                     "input_audio_buffer_commit_empty", "c0")
        await expect(json.dumps({"type": "conversation.item.truncate", "event_id": "t1",
                                 "item_id": "x", "content_index": 0, "audio_end_ms": 0}),
                     "unsupported_in_duplex", "t1")
        await expect(json.dumps({"type": "response.create", "event_id": "r0",
                                 "response": {"instructions": "other"}}),
                     "unsupported_parameter", "r0")
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        await until(ws, "input_audio_buffer.cleared")
        # still usable: audio flows; cancel mutes it; response.create lifts the mute
        pcm = tone("pcm_s16le", 24000, FRAME_S)
        await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                  "audio": base64.b64encode(pcm).decode()}))
        await until(ws, "response.output_audio.delta", 20)
        await ws.send(json.dumps({"type": "response.cancel", "event_id": "x1"}))
        done = await until(ws, "response.done", 20)
        assert done["response"]["status"] == "cancelled"
        muted: list = []
        with pytest.raises(asyncio.TimeoutError):
            await until(ws, "response.output_audio.delta", 0.5, muted)
        await ws.send(json.dumps({"type": "response.create", "event_id": "r1"}))
        await until(ws, "response.output_audio.delta", 20)
        # a message over the hard frame limit cannot be read at all: closed with 1009
        await ws.send("x" * (5 << 20))
        with pytest.raises(ConnectionClosed) as exc:
            for _ in range(1000):
                await recv_json(ws)
        assert exc.value.rcvd.code == 1009
    asyncio.run(asyncio.wait_for(go(), 120))      # a bound for a hung test, not a speed check


def test_wrong_api_key_refused_before_upgrade(bridge_url):
    async def go():
        for headers, url in (({"Authorization": "Bearer wrong"}, bridge_url),
                             ({}, bridge_url), ({}, bridge_url + "?api_key=wrong")):
            with pytest.raises(InvalidStatus) as exc:
                async with connect(url, additional_headers=headers, open_timeout=5):
                    pass
            assert exc.value.response.status_code == 401
            assert b"invalid_api_key" in exc.value.response.body
        with pytest.raises(InvalidStatus) as exc:
            async with connect(bridge_url.replace("/v1/realtime", "/v1/other"),
                               additional_headers={"Authorization": f"Bearer {KEY}"}):
                pass
        assert exc.value.response.status_code == 404
        # browsers cannot set headers: the key may ride in a subprotocol, as OpenAI's does
        async with connect(bridge_url, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"],
                           open_timeout=5) as ws:
            assert ws.subprotocol == "realtime"
            assert (await recv_json(ws))["type"] == "session.created"
    asyncio.run(asyncio.wait_for(go(), 20))


@pytest.mark.slow
def test_openai_sdk_realtime_client(bridge_url):
    """The official openai SDK's realtime client, pointed at the bridge's ws:// URL."""
    openai = pytest.importorskip("openai")

    async def go():
        client = openai.AsyncOpenAI(api_key=KEY, websocket_base_url=bridge_url.rsplit("/", 1)[0],
                                    max_retries=0)
        async with client.realtime.connect(model="nemotron-voicechat") as conn:
            await conn.session.update(session={"type": "realtime", "instructions": "hi",
                                               "audio": {"input": {"format": {
                                                   "type": "audio/pcm", "rate": 24000}}}})
            pcm = base64.b64encode(tone("pcm_s16le", 24000, FRAME_S)).decode()
            seen: dict[str, int] = {}

            async def feed():
                for _ in range(20):
                    await conn.input_audio_buffer.append(audio=pcm)
                    await asyncio.sleep(FRAME_S)
            feeder = asyncio.create_task(feed())
            async for ev in conn:
                seen[ev.type] = seen.get(ev.type, 0) + 1
                if ev.type == "response.output_audio.delta":
                    assert len(base64.b64decode(ev.delta)) % 2 == 0
                if seen.get("response.output_audio.delta", 0) >= 10 and \
                        seen.get("conversation.item.input_audio_transcription.delta"):
                    break
            feeder.cancel()
        assert seen["session.created"] == 1 and seen["session.updated"] == 1
        assert seen.get("response.output_audio_transcript.delta") and "error" not in seen
    asyncio.run(asyncio.wait_for(go(), 20))


# ---- a client that stops reading --------------------------------------------------------

@pytest.mark.slow
def test_non_reading_client_is_bounded_then_disconnected(node):
    """The bridge's queue for a client that reads nothing stays under its bound; audio deltas
    are dropped and counted; after the grace period the connection is aborted."""
    cfg = BridgeConfig(node=node, port=0, api_key=None, outbox_bytes=32 << 10,
                       outbox_hard_bytes=128 << 10, stall_grace_s=1.0, sndbuf_bytes=8 << 10)

    async def go():
        bridge = await Bridge(cfg).start()
        try:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", bridge.port))
            async with connect(f"ws://127.0.0.1:{bridge.port}/v1/realtime", sock=sock,
                               max_queue=2) as ws:
                await ws.send(json.dumps({"type": "session.update", "session": {}}))
                deadline, high = time.monotonic() + 20, None
                while not bridge.totals["aborted_slow"] and time.monotonic() < deadline:
                    for conn in bridge.connections:
                        assert conn.outbox.size <= cfg.outbox_hard_bytes
                        high = conn.outbox
                    await asyncio.sleep(0.1)
                assert bridge.totals["aborted_slow"] == 1
                assert high.dropped > 0 and high.high_water <= cfg.outbox_bytes + 8192
                with pytest.raises(ConnectionClosed):
                    for _ in range(10000):
                        await asyncio.wait_for(ws.recv(), 5)
        finally:
            await bridge.stop()
    asyncio.run(asyncio.wait_for(go(), 40))


# ---- CURVE towards the node -------------------------------------------------------------

@pytest.mark.slow
def test_curve_keys_and_node_side_close(tmp_path):
    """With --curve-keys on the node, the bridge's keys (loaded the CLI's way) open a session;
    a bridge with an unknown key gets no session. A full node's refusal is an `error` and close
    1013. The node closing a session (here: the node shuts down) ends the open response and
    closes the WebSocket with 1000 (no `session.closed`: the API has no such event). (Input
    silence does not close it: the bridge feeds the model silence while its WebSocket lives.)"""
    keys = tmp_path / "keys"
    (keys / "clients").mkdir(parents=True)
    zmq.auth.create_certificates(keys, "server")
    zmq.auth.create_certificates(tmp_path, "bridge")
    zmq.auth.create_certificates(tmp_path, "stranger")
    (tmp_path / "bridge.key").rename(keys / "clients" / "bridge.key")
    raw = tmp_path / "bridge.z85"
    raw.write_text(load_z85(str(tmp_path / "bridge.key_secret"), True)[1].decode())
    cli = parse_args(["--no-auth", "--curve-secret", str(raw),
                      "--node-public-key", str(keys / "server.key")])
    proc, endpoint = start_node(tmp_path, "--curve-keys", str(keys), "--idle-timeout", "1",
                                "--max-sessions", "1")

    async def open_one(curve: CurveKeys) -> str:
        # open_timeout_s: room for a slow CURVE refusal on a loaded 2-core CI machine (1.5 s,
        # then 3.5 s, each once lost the race to it there at the end of a full run), still
        # under the time this test waits for the error
        bridge = await Bridge(BridgeConfig(node=endpoint, port=0, curve=curve,
                                           open_timeout_s=8.0)).start()
        try:
            async with connect(f"ws://127.0.0.1:{bridge.port}/v1/realtime") as ws:
                await until(ws, "session.created")
                await ws.send(json.dumps({"type": "session.update", "session": {}}))
                if curve is not cli.curve:
                    return (await until(ws, "error", 10))["error"]["code"]
                await until(ws, "session.updated", 5)
                async with connect(f"ws://127.0.0.1:{bridge.port}/v1/realtime") as ws2:
                    await ws2.send(json.dumps({"type": "session.update", "session": {}}))
                    refused = await until(ws2, "error", 5)       # --max-sessions 1: full
                    assert refused["error"]["code"] == "session_refused_capacity"
                    with pytest.raises(ConnectionClosed) as exc:
                        await recv_json(ws2)
                    assert exc.value.rcvd.code == 1013             # try again later
                seen: list = []
                await asyncio.sleep(2.0)                   # past --idle-timeout: still open
                proc.send_signal(signal.SIGTERM)           # the node drains: `closed` for all
                with pytest.raises(ConnectionClosed) as exc:
                    while True:
                        seen.append(await recv_json(ws, 10))
                assert exc.value.rcvd.code == 1000
                # no error, no event the API does not have; an open response ends incomplete
                assert not [e for e in seen if e["type"] in ("error", "session.closed")]
                assert [e["response"]["status"] for e in seen if e["type"] == "response.done"
                        ][-1:] in ([], ["incomplete"])
                return "closed"
        finally:
            await bridge.stop()
    try:
        stranger = load_z85(str(tmp_path / "stranger.key_secret"), True)
        # the client library tells a refused CURVE key from a node that is not there
        assert asyncio.run(asyncio.wait_for(
            open_one(CurveKeys(*stranger, cli.curve.server_public)), 20)) == \
            "session_refused_unauthorized"
        assert asyncio.run(asyncio.wait_for(open_one(cli.curve), 25)) == "closed"
    finally:
        stop(proc)
