"""One Realtime client's big append must not hurt the others sharing the bridge's node connection.

Bug caught: the bridge converted a whole `input_audio_buffer.append` into one node `audio`
message. 200 kB of G.711 μ-law (25 s, under the bridge's event limit) became a 1.6 MB message of
16 kHz f32, over the node's message limit; ZMQ then dropped the bridge's one shared connection
and every other client's session ended (`unknown_session`, close 1011). The bridge now cuts what
a client appends into node messages of about a second each, before converting.

Real parts: the node is a subprocess (sim backend, TCP); the bridge runs in-process so its
counters can be read; the clients are real `websockets` connections. Every wait is bounded.
"""
import asyncio
import base64
import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from tests.transports.realtimekit import FRAME_S, start_node, stop, tone, until
from transports import protocol as P
from transports.realtime.codec import MAX_AUDIO_MESSAGE_BYTES
from transports.realtime.feed import FeedPolicy
from transports.realtime.server import Bridge, BridgeConfig

BIG_ULAW = 200_000                 # bytes: 25 s of 8 kHz μ-law, 8x that once at 16 kHz f32
NODE_FRAME_SAMPLES = 1280          # the node's 80 ms input frame at 16 kHz


async def collect(ws, into: list) -> None:
    """Every event of `ws` into `into` until the connection ends."""
    try:
        async for text in ws:
            into.append(json.loads(text))
    except Exception:                # the end of the connection is what the test looks at
        pass


async def stream(ws, seconds: float) -> None:
    """Steady 24 kHz pcm16 appends, one 80 ms chunk every 80 ms (a live caller)."""
    chunk = base64.b64encode(tone("pcm_s16le", 24000, FRAME_S)).decode()
    for _ in range(int(seconds / FRAME_S)):
        try:
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        except ConnectionClosed:          # the assertions after say what it saw
            return
        await asyncio.sleep(FRAME_S)


def deltas(events: list) -> int:
    return sum(e["type"] == "response.output_audio.delta" for e in events)


@pytest.mark.slow
def test_big_g711_append_leaves_other_sessions_alive_and_arrives_whole(tmp_path):
    proc, endpoint = start_node(tmp_path)

    async def go():
        # a lead as long as the append: it goes to the node at once, as before the feed paced
        # input (the pace is test_realtime_live's; the message sizes are this test's)
        bridge = await Bridge(BridgeConfig(node=endpoint, port=0, api_key=None,
                                           feed=FeedPolicy(lead_s=30.0))).start()
        url = f"ws://127.0.0.1:{bridge.port}/v1/realtime"
        try:
            async with connect(url, max_size=None) as victim, connect(url, max_size=None) as big:
                conns = await exercise(bridge, victim, big)
            await settle(bridge)
        finally:
            await bridge.stop()
        return bridge, conns

    try:
        bridge, (victim, big) = asyncio.run(asyncio.wait_for(go(), 60))  # bounds a hang only
    finally:
        stop(proc)
    # the bridge sent nothing near the node's limit, whatever the client appended
    assert bridge.totals["largest_audio_message"] <= MAX_AUDIO_MESSAGE_BYTES < P.MAX_PAYLOAD_BYTES
    # every sample of the 25 s went to the node: 400 000 at 16 kHz f32 after the final flush
    # (besides the silence that kept the session live before the append)
    silence = big.feed.silence_bytes
    assert big.audio_bytes_to_node - silence == BIG_ULAW * 2 * 4
    # and the node accounted for every frame of it (heard, or counted as dropped by its 4 s
    # jitter buffer, which a 25 s burst overflows): nothing vanished on the way
    stats = big.node_stats
    assert stats is not None, "the node never confirmed the big session's close"
    # 312.5 frames of the append (the last one partial), and the silence's
    expected = -(-(BIG_ULAW * 2 + silence // 4) // NODE_FRAME_SAMPLES)
    assert stats["frames_in"] + stats["dropped"] == expected, stats
    assert victim.node_stats is not None and victim.node_stats["frames_in"] > 0


async def exercise(bridge, victim, big) -> tuple:
    """The victim streams steadily; meanwhile `big` appends 200 kB of μ-law at once. Returns
    the bridge's two connections (victim, big)."""
    ids = []
    for ws, session in ((victim, {}), (big, {"input_audio_format": "g711_ulaw"})):
        ids.append((await until(ws, "session.created"))["session"]["id"])
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        await until(ws, "session.updated", 10)
    conns = {c.node_id: c for c in bridge.connections}
    seen_v, seen_b = [], []
    readers = [asyncio.create_task(collect(victim, seen_v)),
               asyncio.create_task(collect(big, seen_b))]
    await stream(victim, 1.0)                             # the victim is live before the append
    before = deltas(seen_v)
    assert before > 0, seen_v
    ulaw = tone("pcmu", 8000, BIG_ULAW / 8000)
    assert len(ulaw) == BIG_ULAW
    await big.send(json.dumps({"type": "input_audio_buffer.append",
                               "audio": base64.b64encode(ulaw).decode()}))
    await big.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
    await stream(victim, 3.0)
    # the victim kept its session: audio still flows, no error, not closed
    assert not [e for e in seen_v if e["type"] == "error"]
    assert victim.state is State.OPEN and big.state is State.OPEN
    assert deltas(seen_v) - before >= 10, [e["type"] for e in seen_v][-20:]
    assert not [e for e in seen_b if e["type"] == "error"]
    await victim.close()
    await big.close()
    await asyncio.gather(*readers)
    return conns[ids[0]], conns[ids[1]]


async def settle(bridge, timeout: float = 10.0) -> None:
    """Until the bridge finished closing its connections (their node sessions confirmed)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while bridge.connections and loop.time() < end:
        await asyncio.sleep(0.05)
