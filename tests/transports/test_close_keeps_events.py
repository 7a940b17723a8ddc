"""`ClientSession.close(keep_events=True)`: every event the node sent before `closed` stays for
the caller. Bug it catches: `close` read the queue down to `closed` and dropped what it
passed, so `python -m transports.wavclient` lost the audio that arrived between its tail and
`closed` while the node counted it sent (its reply file a frame short of `frames_out`)."""
from __future__ import annotations

import asyncio

import numpy as np

from tests.tcpkit import client_of, node_on_tcp
from transports.client import Audio, Closed


def test_close_keeping_events_leaves_every_frame_the_node_counted_sent():
    async def body():
        async with node_on_tcp() as node, client_of(node) as c:
            s = await c.open("kept", sample_rate=16000, format="pcm_f32le")
            for _ in range(12):                     # nothing read meanwhile: all stays queued
                await s.send_audio((0.1 * np.random.randn(1280)).astype(np.float32).tobytes())
                await asyncio.sleep(0.08)
            closed = await s.close(keep_events=True)
            events = []
            while not s.events.empty():
                events.append(s.events.get_nowait())
            audio = sum(isinstance(e, Audio) for e in events)
            assert audio > 0 and audio == closed.stats["frames_out"]
            assert isinstance(events[-1], Closed)
    asyncio.run(body())
