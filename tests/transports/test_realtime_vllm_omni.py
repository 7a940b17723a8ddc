"""vllm-omni's full-duplex Realtime client against the bridge: its documented behaviour, driven
the way its VoiceChat e2e probe and nightly gate drive it (written here from that behaviour).

What the probe does: it connects to `/v1/realtime?duplex=1&model=...&autostart=0&session_id=...`
with no key, sends `session.update` (pcm_f32le in, pcm16 out, `turn_detection: null`,
`extra_body.auto_response`, `idle_timeout_s`, tools), then 190 appends of exactly 1280 float32
samples at once (the gate's `--no-realtime`), each with `format`, `sample_rate_hz`,
`duration_ms` and `audio_end_ms`, then `input_audio_buffer.commit {final: true}`. It fails on
any `error`, on capabilities other than its own (`chunk_period_ms` 80, `model_native_duplex`,
...), on an audio delta that is not 22.05 kHz pcm16 of exactly 80 ms (3528 bytes), on fewer
than 48 deltas or on silent audio, without a `response.speak`, and without a `response.done`
after the commit whose last one is `completed`; it ends with `session.close` and waits for
`session.closed`.

Bugs caught (each seen with vllm-omni's client): deltas under the GA name only (it counts
`response.audio.delta`: zero audio), deltas without `sample_rate_hz` or of 3562-5356 bytes
(24 kHz, resampled), `session.close` answered with `unknown_event_type`, no `response.speak`,
the query's `autostart`/`session_id` ignored, and 140 of the 190 frames dropped.

Real parts: the node is a subprocess (sim backend); the bridge runs in-process; the client is
a real `websockets` connection. Every wait is bounded.
"""
from __future__ import annotations

import asyncio
import base64
import json
import uuid

import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.transports.realtimekit import start_node, stop
from transports.realtime.server import Bridge, BridgeConfig

FRAMES = 190
SAMPLES = 1280                       # 80 ms at 16 kHz
DELTA_BYTES = 2 * 22050 * 80 // 1000  # 3528
# wave differs from vllm-omni's own server here on purpose: many sessions share a GPU
DIFFERS = {"supports_multi_session"}
EXPECTED = {"implementation_level": "model_native_duplex", "chunk_period_ms": 80,
            "supports_core_resumable_request": True, "supports_core_kv_lease": False,
            "supports_multi_session": False}


def frames() -> list[dict]:
    t = np.arange(FRAMES * SAMPLES) / 16000
    x = (0.3 * np.sin(2 * np.pi * 220 * t)).astype("<f4")
    return [{"type": "input_audio_buffer.append",
             "audio": base64.b64encode(x[i * SAMPLES:(i + 1) * SAMPLES].tobytes()).decode(),
             "format": "pcm_f32le", "sample_rate_hz": 16000, "duration_ms": 80,
             "audio_end_ms": (i + 1) * 80} for i in range(FRAMES)]


def session_update(session_id: str) -> dict:
    return {"type": "session.update", "session": {
        "session_id": session_id, "model": "nemotron-voicechat", "modalities": ["audio", "text"],
        "input_audio_format": "pcm_f32le", "output_audio_format": "pcm16",
        "instructions": "You are a voice assistant. Answer briefly.", "idle_timeout_s": 300,
        "turn_detection": None, "extra_body": {"auto_response": True},
        "tools": [{"type": "function", "name": "generate_random_number",
                   "description": "A random integer in a range",
                   "parameters": {"type": "object", "properties": {
                       "min": {"type": "integer"}, "max": {"type": "integer"}}}}]}}


class Probe:
    """What the probe keeps of the events: all of them, in order, and the audio it counts."""

    def __init__(self):
        self.events: list[dict] = []
        self.audio = bytearray()
        self.checked = 0                # the events its checks look at (before its close)

    def add(self, ev: dict) -> None:
        self.events.append(ev)
        if ev["type"] == "response.audio.delta":
            self.audio += base64.b64decode(ev["delta"])

    def count(self, kind: str) -> int:
        return sum(e["type"] == kind for e in self.events)


async def wait_for(probe: Probe, done, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not done() and loop.time() < end:
        assert not probe.count("error"), [e for e in probe.events if e["type"] == "error"]
        await asyncio.sleep(0.02)
    assert done(), [e["type"] for e in probe.events][-20:]


@pytest.mark.slow
def test_vllm_omnis_duplex_probe_passes_against_the_bridge(tmp_path):
    proc, endpoint = start_node(tmp_path)
    probe = Probe()
    probe_conn: list = []
    session_id = f"nemotron-voicechat-{uuid.uuid4().hex}"

    async def go():
        bridge = await Bridge(BridgeConfig(node=endpoint, port=0, api_key=None)).start()
        url = (f"ws://127.0.0.1:{bridge.port}/v1/realtime?duplex=1&model=nemotron-voicechat"
               f"&autostart=0&session_id={session_id}")
        try:
            async with connect(url, max_size=64 << 20) as ws:
                async def reader():
                    async for text in ws:
                        probe.add(json.loads(text))
                task = asyncio.create_task(reader())
                await ws.send(json.dumps(session_update(session_id)))
                await wait_for(probe, lambda: probe.count("session.updated"), 20)
                probe_conn.extend(bridge.connections)
                assert not bridge.connections or all(
                    c.node is not None for c in bridge.connections)
                for ev in frames():                       # --no-realtime: all at once
                    await ws.send(json.dumps(ev))
                await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
                committed = len(probe.events)
                await wait_for(probe, lambda: probe.count("response.audio.delta") >= 48 and any(
                    e["type"] == "response.done" for e in probe.events[committed:]), 60)
                await asyncio.sleep(2.0)                  # the probe's drain, then its checks
                probe.checked = len(probe.events)
                await ws.send(json.dumps({"type": "session.close"}))
                await asyncio.wait_for(task, 30)
            assert ws.close_code == 1000
            while bridge.connections:                     # its close finished (bounded above)
                await asyncio.sleep(0.05)
            return probe.events[-1].get("stats", {}), dict(
                bridge.totals, sent=probe_conn[0].feed.sent,
                to_node=probe_conn[0].audio_bytes_to_node)
        finally:
            await bridge.stop()
    try:
        stats, totals = asyncio.run(asyncio.wait_for(go(), 120))
    finally:
        stop(proc)
    assert not probe.count("error")
    created = next(e for e in probe.events if e["type"] == "session.created")
    caps = created["session"]["capabilities"]
    assert {k: caps[k] for k in EXPECTED if k not in DIFFERS} == \
        {k: v for k, v in EXPECTED.items() if k not in DIFFERS}
    assert caps["supports_multi_session"] is True            # the documented difference
    deltas = [e for e in probe.events if e["type"] == "response.audio.delta"]
    assert {e["sample_rate_hz"] for e in deltas} == {22050}
    assert {len(base64.b64decode(e["delta"])) for e in deltas} == {DELTA_BYTES}
    assert probe.count("response.speak") > 0
    assert len(probe.audio) >= FRAMES * 1764 * 2 // 4
    pcm = np.frombuffer(bytes(probe.audio), "<i2") / 32768.0
    assert float(np.sqrt(np.mean(pcm ** 2))) >= 1e-3
    done = [e for e in probe.events[:probe.checked] if e["type"] == "response.done"]
    assert done[-1]["response"]["status"] == "completed", done[-1]
    assert probe.events[-1]["type"] == "session.closed"
    assert probe.events[-1]["session_id"] == session_id
    # every frame accounted for: heard by the model, counted by the node, or still in the
    # bridge's queue when the client closed (it sent 15 s at once and closed after ~5 s)
    queued = totals["input_unheard_bytes"] // (SAMPLES * 4)
    silence = totals["silence_bytes"] // (SAMPLES * 4)
    assert FRAMES <= stats["frames_in"] + stats["dropped"] + queued - silence <= FRAMES + 2, \
        (stats, totals)
    assert queued > 0


def _bridge_run(tmp_path, body, **cfg):
    proc, endpoint = start_node(tmp_path)

    async def go():
        bridge = await Bridge(BridgeConfig(node=endpoint, port=0, api_key=None, **cfg)).start()
        try:
            return await body(bridge, f"ws://127.0.0.1:{bridge.port}/v1/realtime")
        finally:
            await bridge.stop()
    try:
        return asyncio.run(asyncio.wait_for(go(), 60))
    finally:
        stop(proc)


async def _first(ws, kind: str, timeout: float = 10.0) -> dict:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        ev = json.loads(await asyncio.wait_for(ws.recv(), max(0.01, end - loop.time())))
        if ev["type"] == kind:
            return ev


async def _node_opened(bridge, session_id: str, timeout: float = 15.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if any(c.node is not None for c in bridge.connections
               if c.dialect.session_id == session_id):
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.slow
def test_autostart_opens_at_connect_and_autostart_0_waits_for_session_update(tmp_path):
    """vllm-omni's `autostart`: by default its session opens as the socket connects (no event
    needed); with `autostart=0` only the client's `session.update` opens it. Catches the query
    ignored either way."""
    async def body(bridge, url):
        async with connect(url + "?duplex=1&session_id=auto-1") as ws:
            created = await _first(ws, "session.created")
            assert created["session"]["id"] == "auto-1"
            assert await _node_opened(bridge, "auto-1")
        async with connect(url + "?duplex=1&autostart=0&session_id=auto-2") as ws:
            await _first(ws, "session.created")
            assert not await _node_opened(bridge, "auto-2", 1.0)
            await ws.send(json.dumps({"type": "session.update", "session": {}}))
            await _first(ws, "session.updated")
            assert await _node_opened(bridge, "auto-2")
    _bridge_run(tmp_path, body)


def test_session_close_and_dialect_errors(tmp_path):
    """`session.close` is vllm-omni's: in the GA dialect it is an unknown event (the session
    goes on); an unknown `dialect` is refused with an error and close 1008. Catches vllm-omni's
    events leaking into OpenAI clients, and a typo'd dialect silently served as GA."""
    async def body(bridge, url):
        async with connect(url) as ws:
            await _first(ws, "session.created")
            await ws.send(json.dumps({"type": "session.close"}))
            err = await _first(ws, "error")
            assert err["error"]["code"] == "unknown_event_type"
            await ws.send(json.dumps({"type": "session.update", "session": {}}))
            await _first(ws, "session.updated")
        async with connect(url + "?dialect=vllm") as ws:
            err = await _first(ws, "error")
            assert err["error"]["code"] == "invalid_dialect"
            with pytest.raises(Exception):
                await asyncio.wait_for(ws.recv(), 5)
            assert ws.close_code == 1008
    _bridge_run(tmp_path, body)


@pytest.mark.slow
def test_a_dropped_socket_resumes_its_session_by_id_within_the_grace(tmp_path):
    """vllm-omni's `session_id`: a socket that drops without `session.close` leaves its session
    running for `resume_grace_s`; a new socket naming the id takes the same session over (the
    same node session, audio flowing again); a second live socket naming it is refused; past
    the grace an unclaimed session ends. Catches the id ignored (a dropped socket ending the
    call), a session two sockets drive at once, and parked sessions that never end."""
    async def body(bridge, base):
        url = base + "?duplex=1&session_id="
        ws = await connect(url + "call-1")
        await _first(ws, "session.created")
        assert await _node_opened(bridge, "call-1")
        (conn,) = bridge.connections
        node_session = conn.node
        async with connect(url + "call-1") as twin:          # while the first is live
            err = await _first(twin, "error")
            assert err["error"]["code"] == "session_id_in_use"
        ws.transport.abort()                                 # the network drops it
        await asyncio.sleep(0.5)
        assert conn.parked and conn in bridge.connections
        async with connect(url + "call-1") as again:
            created = await _first(again, "session.created")
            assert created["session"]["id"] == "call-1" and created.get("resumed") is True
            await _first(again, "response.audio.delta")
            assert conn.node is node_session and bridge.totals["resumed"] == 1
            again.transport.abort()
        await asyncio.sleep(0.3)
        assert conn.parked
        loop = asyncio.get_running_loop()
        end = loop.time() + 6
        while bridge.connections and loop.time() < end:      # the grace runs out
            await asyncio.sleep(0.1)
        assert not bridge.connections and not bridge.named
        assert node_session.closed is not None
    _bridge_run(tmp_path, body, resume_grace_s=2.0)
