"""Stream a WAV file into a node as one session and save the reply.

    python -m transports.wavclient --connect tcp://127.0.0.1:5555 --wav in.wav --out reply.wav

Input is sent in 20 ms chunks at real-time pace (`--pace N`: N times faster), as 16-bit PCM at the
file's own rate when the protocol allows it (else resampled to 16 kHz here). After the file, the
client keeps listening for `--tail` seconds, closes the session and prints the node's stats.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from transports import audio as A
from transports import protocol as P
from transports.client import Audio, Closed, Error, FunctionCall, NodeClient, Text

CHUNK_MS = 20


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """Mono float32 samples and the rate of a 16-bit (or 8/32-bit) PCM WAV file."""
    with wave.open(str(path), "rb") as w:
        rate, channels, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
        raw = w.readframes(w.getnframes())
    dtype = {1: np.uint8, 2: "<i2", 4: "<i4"}.get(width)
    if dtype is None:
        raise ValueError(f"{path}: {8 * width}-bit samples are not supported")
    x = np.frombuffer(raw, dtype).astype(np.float32)
    x = (x - 128.0) / 128.0 if width == 1 else x / float(2 ** (8 * width - 1))
    return x.reshape(-1, channels).mean(axis=1), rate


def write_wav(path: str | Path, x: np.ndarray, rate: int) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(A.float_to_int16(x).astype("<i2").tobytes())


@dataclass
class StreamResult:
    session: str
    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    rate: int = 22050
    frames: list[int] = field(default_factory=list)
    agent_text: str = ""
    user_text: str = ""
    calls: list[FunctionCall] = field(default_factory=list)
    errors: list[Error] = field(default_factory=list)
    stats: dict = field(default_factory=dict)


async def stream(client: NodeClient, session: str, x: np.ndarray, rate: int, pace: float = 1.0,
                 tail_s: float = 1.0, instructions: str = "", tools: list | None = None,
                 function_output: str | None = None) -> StreamResult:
    if rate not in P.SAMPLE_RATES:
        x, rate = A.StreamResampler(rate, 16000)(x, last=True), 16000
    s = await client.open(session, sample_rate=rate, format="pcm_s16le",
                          instructions=instructions, tools=tools or [])
    res = StreamResult(session, rate=s.opened.get("output_sample_rate", 22050))
    chunks: list[np.ndarray] = []
    receiver = asyncio.get_running_loop().create_task(
        _receive(s, res, chunks, function_output))
    step = rate * CHUNK_MS // 1000
    t0 = time.monotonic()
    for i in range(0, len(x), step):
        await s.send_audio(A.encode(x[i:i + step], "pcm_s16le"))
        await _sleep_until(t0 + (i + step) / rate / pace)
    await asyncio.sleep(tail_s)
    receiver.cancel()
    await asyncio.gather(receiver, return_exceptions=True)
    closed = await s.close()
    while not s.events.empty():                  # what arrived between the tail and `closed`
        _collect(s.events.get_nowait(), res, chunks)
    res.stats = closed.stats
    res.audio = np.concatenate(chunks) if chunks else res.audio
    return res


async def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def _receive(s, res: StreamResult, chunks: list, function_output: str | None) -> None:
    while True:
        ev = await s.next_event()
        _collect(ev, res, chunks)
        if isinstance(ev, FunctionCall) and function_output is not None:
            await s.function_result(ev.call_id, function_output)


def _collect(ev, res: StreamResult, chunks: list) -> None:
    if isinstance(ev, Audio):
        chunks.append(A.decode(ev.payload, "pcm_s16le"))
        res.frames.append(ev.frame)
    elif isinstance(ev, Text):
        if ev.channel == "agent":
            res.agent_text += ev.text
        else:
            res.user_text += ev.text
    elif isinstance(ev, FunctionCall):
        res.calls.append(ev)
    elif isinstance(ev, Error):
        res.errors.append(ev)
    elif isinstance(ev, Closed):
        res.stats = ev.stats


async def _main(args) -> int:
    x, rate = read_wav(args.wav)
    async with NodeClient(args.connect) as client:
        res = await stream(client, args.session, x, rate, args.pace, args.tail,
                           args.instructions)
    write_wav(args.out, res.audio, res.rate)
    print(json.dumps({"session": res.session, "out": str(args.out),
                      "seconds_out": round(len(res.audio) / res.rate, 2),
                      "agent_text": res.agent_text[-200:], "user_text": res.user_text[-200:],
                      "function_calls": [c.name for c in res.calls],
                      "errors": [f"{e.code}: {e.message}" for e in res.errors],
                      # every audio message's frame number once, in order, with no gap
                      "frames_in_order": res.frames == list(range(res.frames[0], res.frames[0]
                                                                  + len(res.frames)))
                      if res.frames else True,
                      "stats": res.stats}, indent=2))
    return 0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--connect", default="tcp://127.0.0.1:5555")
    ap.add_argument("--wav", required=True)
    ap.add_argument("--out", default="reply.wav")
    ap.add_argument("--session", default=f"wav-{int(time.time())}")
    ap.add_argument("--pace", type=float, default=1.0, help="N times real time")
    ap.add_argument("--tail", type=float, default=1.0, help="seconds to listen after the file")
    ap.add_argument("--instructions", default="")
    args = ap.parse_args(argv)
    if args.pace <= 0:
        ap.error("--pace must be > 0")
    try:
        sys.exit(asyncio.run(_main(args)))
    except FileNotFoundError as exc:
        sys.exit(f"wavclient: {exc}")
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
