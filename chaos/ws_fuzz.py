"""A bounded, deterministic fuzzer of the Realtime WebSocket bridge.

    stats = await run("ws://127.0.0.1:8125/v1/realtime", count=300, seed=1)
    # {"tried": 300, "answered": 212, "errors": 212, "by_code": {...}, "closes": {...}, ...}

`count` client events go out over CONNS WebSocket connections, chosen by `random.Random(seed)`
(same seed, same events in the same order). The plan interleaves a sweep, in seeded order, of
wrong-typed values for every field the bridge reads of every event type it handles (its
HANDLERS table, read at run time) with random cases: malformed and deeply nested JSON, JSON that
is not an event, unknown event types, invalid base64 and partial samples, binary frames, huge
appends (25 s of G.711 just under the event limit, which the bridge must cut; an event over the
limit; at most HUGE_FRAME_MAX frames over the frame limit, which cost their connection), format
switches mid-session, and abrupt closes (the TCP connection aborted under the WebSocket).
Every server event is read and counted by type and error code; a connection that ends is
replaced on its next use. Nothing waits unbounded: every connect, send and the final listening
(SETTLE_S at most) has a timeout.
"""
from __future__ import annotations

import asyncio
import base64
import collections
import json
import random

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from chaos.quiet import fuzz_round, until_quiet

CONNS = 3
SETTLE_S = 1.5
QUIET_S = 0.3
SEND_TIMEOUT_S = 5.0
HUGE_FRAME_MAX = 1
MAX_EVENT_BYTES = 1 << 20            # the bridge's default event limit
WRONG = (None, True, 0, -1, 1.5, "", "x", [], [1], {}, {"type": 5}, "A" * 200)
FIELDS = {                           # the fields the bridge reads, dotted into nested objects
    "session.update": ["session", "session.instructions", "session.tools",
                       "session.input_audio_format", "session.output_audio_format",
                       "session.audio", "session.audio.input.format",
                       "session.audio.output.format", "session.voice", "session.modalities"],
    "input_audio_buffer.append": ["audio", "format", "sample_rate_hz"],
    "input_audio_buffer.commit": ["final"],
    "conversation.item.create": ["item", "item.type", "item.call_id", "item.output"],
    "response.create": ["response", "response.instructions", "response.tools"],
}


def _handlers() -> list[str]:
    from transports.realtime.connection import HANDLERS
    return sorted(HANDLERS)


def sweep_plan(rng: random.Random) -> list[tuple[str, str, object]]:
    plan = []
    for type_ in _handlers():
        for field in ["event_id", *FIELDS.get(type_, [])]:
            plan += [(type_, field, value) for value in WRONG]
    rng.shuffle(plan)
    return plan


def set_path(event: dict, path: str, value: object) -> dict:
    keys = path.split(".")
    node = event
    for key in keys[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[keys[-1]] = value
    return event


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class _Conn:
    def __init__(self):
        self.ws = None
        self.reader: asyncio.Task | None = None


class Fuzzer:
    def __init__(self, url: str, seed: int, rate: float = 300.0, headers: dict | None = None):
        self.url, self.rng, self.rate, self.headers = url, random.Random(seed), rate, headers
        self.conns = [_Conn() for _ in range(CONNS)]
        self.stats = collections.Counter()
        self.by_type: collections.Counter = collections.Counter()
        self.by_code: collections.Counter = collections.Counter()
        self.closes: collections.Counter = collections.Counter()
        self.sweep = sweep_plan(self.rng)
        self.swept = 0
        self.huge_frames = 0
        self.last_event = 0.0

    # ---- connections ------------------------------------------------------------------------

    async def _ws(self, c: _Conn):
        if c.ws is not None and c.reader is not None and not c.reader.done():
            return c.ws
        try:
            c.ws = await connect(self.url, max_size=None, open_timeout=5, close_timeout=1,
                                 ping_interval=None, additional_headers=self.headers)
        except (OSError, asyncio.TimeoutError, InvalidHandshake):
            self.stats["connect_failures"] += 1
            c.ws = None
            return None
        self.stats["connections"] += 1
        c.reader = asyncio.get_running_loop().create_task(self._read(c.ws))
        return c.ws

    async def _read(self, ws) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for text in ws:
                self.last_event = loop.time()
                try:
                    ev = json.loads(text)
                    type_ = str(ev.get("type"))
                except (ValueError, AttributeError):
                    self.by_type["undecodable"] += 1
                    continue
                self.by_type[type_] += 1
                if type_ == "error":
                    self.by_code[str((ev.get("error") or {}).get("code"))] += 1
        except ConnectionClosed:
            pass
        rcvd = ws.close_code
        self.closes[str(rcvd) if rcvd is not None else "abnormal"] += 1

    async def _send(self, message, c: _Conn | None = None) -> None:
        c = c or self.rng.choice(self.conns)
        self.stats["tried"] += 1
        ws = await self._ws(c)
        if ws is None:
            self.stats["unsent"] += 1
            return
        try:
            await asyncio.wait_for(ws.send(message), SEND_TIMEOUT_S)
        except (ConnectionClosed, asyncio.TimeoutError, OSError):
            self.stats["unsent"] += 1

    async def close(self) -> None:
        for c in self.conns:
            if c.ws is not None:
                try:
                    await asyncio.wait_for(c.ws.close(), 2)
                except (asyncio.TimeoutError, OSError, ConnectionClosed):
                    c.ws.transport.abort()
        await asyncio.gather(*(c.reader for c in self.conns if c.reader), return_exceptions=True)

    async def settle(self) -> None:
        await until_quiet(lambda: self.last_event, SETTLE_S, QUIET_S)

    def report(self) -> dict:
        return {"tried": self.stats["tried"], "unsent": self.stats["unsent"],
                "answered": self.by_type["error"], "errors": self.by_type["error"],
                "by_code": dict(self.by_code), "by_type_top": dict(self.by_type.most_common(8)),
                "closes": dict(self.closes), "connections": self.stats["connections"],
                "connect_failures": self.stats["connect_failures"],
                "aborted": self.stats["aborted"], "huge_frames": self.huge_frames,
                "sweep_covered": self.swept, "sweep_total": len(self.sweep)}

    # ---- the plan ---------------------------------------------------------------------------

    async def fuzz(self, count: int) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        cases = {self._malformed: 4, self._not_an_event: 3, self._unknown_type: 3,
                 self._bad_audio: 3, self._binary: 2, self._huge: 1, self._formats: 3,
                 self._abort: 1, self._valid_audio: 6}     # aborts rare: they cut answers short
        while self.stats["tried"] < count:
            if self.swept < len(self.sweep) and self.rng.random() < 0.5:
                await self._swept_case()
            else:
                await self.rng.choices(list(cases), list(cases.values()))[0]()
            ahead = start + self.stats["tried"] / self.rate - loop.time()
            await asyncio.sleep(max(0.0, ahead))

    async def _swept_case(self) -> None:
        type_, field, value = self.sweep[self.swept]
        self.swept += 1
        event = {"type": type_, "event_id": f"sw{self.swept}"}
        if type_ == "input_audio_buffer.append":
            event["audio"] = _b64(bytes(960))
        await self._send(json.dumps(set_path(event, field, value)))

    async def _malformed(self) -> None:
        await self._send(self.rng.choice([
            "{", '{"type": "session.update",', "\x00", "nul", "1e99999", "[" * 100_000,
            '{"type": "input_audio_buffer.append", "audio": "' + "A" * 1000,
            "".join(chr(self.rng.randrange(32, 127)) for _ in range(self.rng.randrange(200)))]))

    async def _not_an_event(self) -> None:
        await self._send(self.rng.choice(["[1, 2]", "null", '"x"', "{}", '{"type": 5}',
                                          '{"type": null}', '{"type": ["session.update"]}']))

    async def _unknown_type(self) -> None:
        name = self.rng.choice(["session.delete", "input_audio_buffer.appendx", "", "x" * 500,
                                f"fuzz.{self.rng.randrange(10 ** 6)}", "__proto__"])
        await self._send(json.dumps({"type": name, "event_id": "u"}))

    async def _bad_audio(self) -> None:
        audio = self.rng.choice(["!!!!", "abc", "====", "QUJD\n", "\u00e9t\u00e9",
                                 _b64(b"\x01\x02\x03")])        # the last: not whole samples
        await self._send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))

    async def _binary(self) -> None:
        await self._send(self.rng.randbytes(self.rng.randrange(1, 2000)))

    async def _huge(self) -> None:
        """Near and over the bridge's limits. 25 s of G.711 under the event limit is what once
        took down every session on the bridge; it must be cut and forwarded."""
        c = self.rng.choice(self.conns)
        kind = self.rng.randrange(3 if self.huge_frames >= HUGE_FRAME_MAX else 4)
        if kind <= 1:
            await self._send(json.dumps({"type": "session.update",
                                         "session": {"input_audio_format": "g711_ulaw"}}), c)
            raw = bytes([0xFF]) * self.rng.randrange(150_000, MAX_EVENT_BYTES * 3 // 4 - 1000)
            await self._send(json.dumps({"type": "input_audio_buffer.append",
                                         "audio": _b64(raw)}), c)
        elif kind == 2:                                  # over the event limit: an `error`
            await self._send(json.dumps({"type": "input_audio_buffer.append",
                                         "audio": "A" * (MAX_EVENT_BYTES + 4)}), c)
        else:                                            # over the frame limit: closed, 1009
            self.huge_frames += 1
            await self._send("x" * (5 << 20), c)

    async def _formats(self) -> None:
        """Formats switched mid-stream, per chunk too, some of them wrong."""
        c = self.rng.choice(self.conns)
        fmt = self.rng.choice(["pcm16", "g711_alaw", "pcm_f32le", "g711_ulaw", "opus", 16000])
        await self._send(json.dumps({"type": "session.update",
                                     "session": {"input_audio_format": fmt}}), c)
        rate = self.rng.choice([8000, 16000, 24000, 44100, -1, "fast"])
        await self._send(json.dumps({"type": "input_audio_buffer.append", "audio": _b64(bytes(640)),
                                     "format": {"type": "audio/pcm"}, "sample_rate_hz": rate}), c)

    async def _abort(self) -> None:
        """The TCP connection under a live WebSocket cut without a close frame."""
        c = self.rng.choice(self.conns)
        ws = await self._ws(c)
        if ws is not None:
            await self._send(json.dumps({"type": "input_audio_buffer.append",
                                         "audio": _b64(bytes(3840))}), c)
            ws.transport.abort()
            self.stats["aborted"] += 1

    async def _valid_audio(self) -> None:
        """Well-formed traffic in between, so sessions live while the rest goes on."""
        await self._send(json.dumps({"type": "input_audio_buffer.append",
                                     "audio": _b64(bytes(3840))}))


async def run(url: str, count: int, seed: int, rate: float = 300.0,
              headers: dict | None = None) -> dict:
    """Send `count` fuzz events to the bridge at `url`; the counts of what came back."""
    return await fuzz_round(Fuzzer(url, seed, rate, headers), count)
