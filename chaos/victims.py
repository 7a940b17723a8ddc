"""The chaos run's victims: sessions that stream 80 ms frames of 16 kHz audio in real time, each
its own `NodeClient`, and account for every frame they sent and every audio message they got.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from transports import client as C

FRAME_S = 0.08
FRAME = (0.2 * np.sin(2 * np.pi * 220 * np.arange(1280) / 16000)).astype(np.float32)
FORMATS = ({"format": "pcm_f32le", "payload": FRAME.tobytes()},            # 16 kHz: no resampling
           {"format": "pcm_s16le", "payload": (FRAME * 32767).astype("<i2").tobytes()})
CLOSE_TIMEOUT_S = 8.0


@dataclass
class Victim:
    name: str
    relayed: bool
    format: str
    identity: str = ""
    sent: int = 0                 # frames sent (one per message, 80 ms at 16 kHz)
    audio_in: int = 0             # output frames received
    errors: dict = field(default_factory=dict)
    lost: str | None = None       # why the session ended without our close
    stats: dict | None = None     # the node's `closed` stats
    resumes: int | None = None
    slow: bool = False            # stops reading 2 s in every 20
    out_of_order: int = 0         # audio received with a seq not above the one before
    last_seq: int = -1

    @property
    def unaccounted(self) -> int:
        """Input frames neither heard nor counted as dropped. A node that splits its drops
        reports `dropped_in` (its `dropped` then also holds output frames the client could not
        take, which are no input)."""
        if self.stats is None:
            return self.sent
        dropped = self.stats.get("dropped_in", self.stats.get("dropped", 0))
        return self.sent - self.stats.get("frames_in", 0) - dropped


class VictimRun:
    """One victim session: open, stream in real time, consume events, close."""

    def __init__(self, v: Victim, endpoint: str, fmt: dict):
        self.v, self.fmt = v, fmt
        self.client = C.NodeClient(endpoint)
        v.identity = self.client.identity.decode()
        self.session: C.ClientSession | None = None
        self.tasks: list[asyncio.Task] = []

    async def open(self) -> None:
        self.client.connect()
        self.session = await self.client.open(self.v.name, sample_rate=16000,
                                              format=self.fmt["format"], timeout=20)
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self._stream()), loop.create_task(self._consume())]

    async def _stream(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while self.v.lost is None:
            try:
                await self.session.send_audio(self.fmt["payload"])
            except C.NodeUnavailable:
                pass                                    # counted below: its seq is spent
            self.v.sent = self.session.seq
            due += FRAME_S
            await asyncio.sleep(max(0.0, due - loop.time()))

    async def _consume(self) -> None:
        loop = asyncio.get_running_loop()
        pause_at = loop.time() + 20.0
        while True:
            if self.v.slow and loop.time() >= pause_at:
                await asyncio.sleep(2.0)                 # not reading: the node queues for it
                pause_at = loop.time() + 18.0
            ev = await self.session.next_event()
            if isinstance(ev, C.Audio):
                self.v.audio_in += 1
                if ev.seq <= self.v.last_seq:
                    self.v.out_of_order += 1
                self.v.last_seq = ev.seq
            elif isinstance(ev, C.Error):
                self.v.errors[ev.code] = self.v.errors.get(ev.code, 0) + 1
                if ev.code == "unknown_session":
                    self.v.lost = self.v.lost or "the node no longer knew the session"
            elif isinstance(ev, C.Closed):
                self.v.lost = self.v.lost or "closed by the node"
                self.v.stats = ev.stats
                return

    async def close(self) -> None:
        for task in self.tasks:                          # close() reads the events itself
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        s = self.session
        if s is not None:
            self.v.sent = s.seq
            self.v.resumes = getattr(s, "resumes", None)
            if s.closed is not None:
                self.v.lost = self.v.lost or "closed by the node"
            try:
                self.v.stats = (await s.close(timeout=CLOSE_TIMEOUT_S)).stats
            except (asyncio.TimeoutError, C.NodeUnavailable):
                self.v.lost = self.v.lost or "close not confirmed"
        await self.client.aclose()
