"""A connected Realtime client is a live call, and its input reaches the model whole.

Bugs these catch: the node closing a session 10 s after the app stopped appending (a muted
microphone or push-to-talk ended the call), audio appended faster than real time cut to the
node's 4 s jitter buffer with no error (a 6 s burst: ~2 s lost), an append past the bridge's
bound queued anyway or refused without telling the client, and `input_audio_buffer.clear`
leaving queued audio to be heard.

Real parts: the node is a subprocess (sim backend, TCP); the bridge runs in-process so its
counters can be read; the clients are real `websockets` connections. Every wait is bounded.
"""
import asyncio
import base64
import json

import pytest
from websockets.asyncio.client import connect
from websockets.protocol import State

from tests.transports.realtimekit import start_node, stop, tone, until
from tests.transports.test_realtime_limits import collect, settle
from transports.realtime.feed import FeedPolicy
from transports.realtime.server import Bridge, BridgeConfig

F32_16K = 16000 * 4                 # bytes a second the bridge sends the node


def run_bridge(tmp_path, body, *node_args: str, feed: FeedPolicy = FeedPolicy()):
    """Runs `body(bridge, ws)` against a fresh node and an in-process bridge; returns
    (bridge, the connection's bridge side, what body returned)."""
    proc, endpoint = start_node(tmp_path, *node_args)

    async def go():
        bridge = await Bridge(BridgeConfig(node=endpoint, port=0, feed=feed)).start()
        try:
            async with connect(f"ws://127.0.0.1:{bridge.port}/v1/realtime") as ws:
                await until(ws, "session.created")
                await ws.send(json.dumps({"type": "session.update", "session": {}}))
                await until(ws, "session.updated", 10)
                conn = next(iter(bridge.connections))
                result = await body(bridge, conn, ws)
            await settle(bridge)
        finally:
            await bridge.stop()
        return bridge, conn, result
    try:
        return asyncio.run(asyncio.wait_for(go(), 60))
    finally:
        stop(proc)


def append(seconds: float) -> str:
    pcm = tone("pcm_s16le", 24000, seconds)
    return json.dumps({"type": "input_audio_buffer.append",
                       "audio": base64.b64encode(pcm).decode()})


@pytest.mark.slow
def test_a_client_that_sends_nothing_keeps_its_call(tmp_path):
    """The node ends sessions that hear nothing for 1 s here; the client appends nothing for
    3 s and its call goes on: the bridge fed the model silence, which the node heard."""
    async def body(bridge, conn, ws):
        seen: list = []
        reader = asyncio.create_task(collect(ws, seen))
        await asyncio.sleep(3.0)
        assert ws.state is State.OPEN
        assert not [e for e in seen if e["type"] in ("session.closed", "error")], seen[-5:]
        await ws.close()
        await reader
    bridge, conn, _ = run_bridge(tmp_path, body, "--idle-timeout", "1")
    assert bridge.totals["silence_bytes"] >= 2.0 * F32_16K
    assert conn.node_stats is not None and conn.node_stats["frames_in"] >= 25, conn.node_stats


@pytest.mark.slow
def test_a_burst_faster_than_real_time_is_heard_whole(tmp_path):
    """6 s appended at once (the node's jitter buffer holds 4 s): the bridge feeds it at the
    model's pace and the node hears every frame, drops none."""
    async def body(bridge, conn, ws):
        seen: list = []
        reader = asyncio.create_task(collect(ws, seen))     # a client that reads its events
        await ws.send(append(6.0))
        loop = asyncio.get_running_loop()
        end = loop.time() + 15
        while (conn.feed.queued or conn.feed.sent < 6.0 * F32_16K) and loop.time() < end:
            await asyncio.sleep(0.1)
        assert conn.feed.queued == 0
        await asyncio.sleep(0.5)                  # the last frames reach the node
        await ws.close()
        await reader
    bridge, conn, _ = run_bridge(tmp_path, body)
    stats = conn.node_stats
    assert stats is not None, "the node never confirmed the close"
    # what the node did not hear is at most the lead's frames, in flight at the close (sent
    # at once, ~2 s of the 6 were dropped)
    assert stats["dropped"] <= 4, stats
    assert stats["frames_in"] >= 75, stats        # 6 s: 75 frames of 80 ms, then silence
    assert bridge.totals["input_refused_bytes"] == 0


def test_past_the_bound_an_append_is_refused_with_an_error_and_counted(tmp_path):
    """A 1 s bound: 2 s appended at once is refused whole with `input_audio_buffer_full`;
    the call goes on, and what fits afterwards is queued."""
    async def body(bridge, conn, ws):
        await ws.send(append(2.0))
        err = await until(ws, "error", 5)
        assert err["error"]["code"] == "input_audio_buffer_full"
        assert "queued" in err["error"]["message"]
        await ws.send(append(0.5))
        await asyncio.sleep(0.3)
        assert ws.state is State.OPEN
        return err
    bridge, conn, _ = run_bridge(tmp_path, body, feed=FeedPolicy(capacity_s=1.0))
    # all of it (less what the streaming resampler still holds)
    assert 1.95 * F32_16K <= bridge.totals["input_refused_bytes"] <= 2.0 * F32_16K
    assert conn.feed.sent + conn.feed.queued >= 0.45 * F32_16K     # the later append fit


def test_clear_drops_queued_input_the_model_has_not_heard(tmp_path):
    async def body(bridge, conn, ws):
        await ws.send(append(4.0))
        await asyncio.sleep(0.5)
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        await until(ws, "input_audio_buffer.cleared", 5)
        assert conn.feed.queued == 0
    bridge, conn, _ = run_bridge(tmp_path, body)
    assert 2.5 * F32_16K <= bridge.totals["input_cleared_bytes"] <= 4.0 * F32_16K
