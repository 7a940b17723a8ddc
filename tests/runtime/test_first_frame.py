"""A beat's first frame routed while its second computes (`Capabilities.first_frame`), on
virtual time through a real node with the sim executor: each beat's frame 0 is routed at the
cost model's share of the beat's compute and frame 1 at the beat's end, and the client gets
every frame once, in order. Bugs these catch: frame 0 held back until the beat ends (no gain),
routed twice (a duplicate frame), routed after frame 1 or with a wrong number (audio out of
order), and a beat's latency measured from the first routing instead of the last."""
from __future__ import annotations

import asyncio

from dataclasses import replace

from sim.costmodel import CostModel
from tests.nodekit import VirtualNode
from transports.client import Audio


def _audio(vn, cs, frames: int) -> list[tuple[float, int]]:
    """(arrival time, frame number) of the first `frames` audio messages, the client sending
    80 ms frames in real time meanwhile."""
    got: list[tuple[float, int]] = []

    async def send():
        for _ in range(frames + 8):
            await cs.send_audio(bytes(4 * 1280))
            await asyncio.sleep(0.08)

    async def body():
        sender = asyncio.ensure_future(send())
        while len(got) < frames:
            ev = await cs.next_event(5.0)
            if isinstance(ev, Audio):
                got.append((vn.clock.now(), ev.frame))
        sender.cancel()
    vn.run(body())
    return got


def _node(share: float) -> VirtualNode:
    return VirtualNode(2, cost=replace(CostModel.load(), first_frame_share=share))


def test_frame_0_is_routed_at_its_share_of_the_beat_and_frame_1_at_the_end():
    share = 0.4
    vn = _node(share)
    try:
        cs = vn.run(vn.client.open("a", sample_rate=16000, format="pcm_f32le"))
        got = _audio(vn, cs, 24)
        frames = [f for _, f in got]
        assert frames == list(range(frames[0], frames[0] + len(frames)))
        records = [r for r in vn.node.clock_actor.stats.records if r.sessions]
        assert len(records) >= 10
        for r in records:
            # the clock's own time between the two routings is ~0 on virtual time
            assert abs((r.latency_s - r.first_s) - (1 - share) * r.compute_s) < 1e-3, r
            assert r.first_s < r.latency_s
        # a beat's two frames reach the client the rest of the beat apart
        arrivals = dict((f, t) for t, f in got)
        gaps = [arrivals[f + 1] - arrivals[f] for f in frames[:-1] if f % 2 == 0]
        compute = sorted(r.compute_s for r in records)[len(records) // 2]
        assert gaps and all(abs(g - (1 - share) * compute) < 0.01 for g in gaps), gaps
    finally:
        vn.close()


def test_a_share_of_one_routes_both_frames_together():
    vn = _node(1.0)
    try:
        cs = vn.run(vn.client.open("a", sample_rate=16000, format="pcm_f32le"))
        got = _audio(vn, cs, 16)
        frames = [f for _, f in got]
        assert frames == list(range(frames[0], frames[0] + len(frames)))
        for r in vn.node.clock_actor.stats.records:
            assert abs(r.latency_s - r.first_s) < 1e-3
    finally:
        vn.close()
