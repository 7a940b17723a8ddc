"""Stream an audio file into a node as one session and save the reply.

    python -m transports.wavclient --connect tcp://127.0.0.1:5555 --wav in.wav --out reply.wav

The input is any file libsndfile reads: WAV (8/16/24/32-bit integer, 32/64-bit float), FLAC,
OGG Vorbis; several channels are mixed to mono. It is sent in 20 ms chunks at real-time pace
(`--pace N`: N times faster), as 16-bit PCM at the file's own rate when the protocol allows it
(else resampled to 16 kHz here). After the file, the client keeps listening for `--tail` seconds,
closes the session and prints the node's stats. The reply is written in the format the output
path's extension names: .wav (16-bit PCM), .flac (16-bit) or .ogg (Vorbis).

A file it cannot read or write, or a node that does not answer within `--timeout` seconds, ends
it with one line on stderr and exit status 1.
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
import zmq

from transports import audio as A
from transports import protocol as P
from transports.client import (Audio, Closed, Error, FunctionCall, NodeClient, NodeUnavailable,
                               Refused, Text)

CHUNK_MS = 20
ANSWER_TIMEOUT_S = 5.0      # default wait for the node's first answer
# The reply's file format (libsndfile's format and subtype) by the output path's extension.
# The reply arrives as 16-bit PCM, so the lossless formats keep exactly its samples.
OUT_FORMATS = {".wav": ("WAV", "PCM_16"), ".flac": ("FLAC", "PCM_16"), ".ogg": ("OGG", "VORBIS")}


class AudioFileError(Exception):
    """An audio file that cannot be read or written; the message is `<path>: <reason>`."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"{path}: {reason}")


def read_audio(path: str | Path) -> tuple[np.ndarray, int]:
    """Mono float32 samples and the sample rate of an audio file; channels are averaged."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise AudioFileError(path, exc.strerror or str(exc)) from None
    try:
        # Decoded from memory, the format comes from the content alone (soundfile takes a name
        # ending in `.raw` for headerless audio and would ask for its rate).
        x, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except sf.SoundFileError as exc:
        raise AudioFileError(path, f"not a readable audio file ({_reason(exc)})") from None
    # A float file may hold NaN or infinities, which the resampler would smear over the call.
    return np.nan_to_num(x.mean(axis=1), nan=0.0, posinf=1.0, neginf=-1.0), rate


def out_format(path: str | Path) -> tuple[str, str]:
    """libsndfile's format and subtype for an output path, by its extension."""
    ext = Path(path).suffix.lower()
    if ext not in OUT_FORMATS:
        what = f"unsupported output extension {ext!r}" if ext else "no output extension"
        raise AudioFileError(path, f"{what}, use one of {', '.join(OUT_FORMATS)}")
    return OUT_FORMATS[ext]


def write_audio(path: str | Path, x: np.ndarray, rate: int) -> None:
    """Mono float32 samples to a file in the format `path`'s extension names."""
    fmt, subtype = out_format(path)
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:      # opened here: OS errors name their cause
            sf.write(f, x, rate, format=fmt, subtype=subtype)
    except OSError as exc:
        raise AudioFileError(path, exc.strerror or str(exc)) from None
    except sf.SoundFileError as exc:
        raise AudioFileError(path, f"cannot write {fmt} ({_reason(exc)})") from None


def _reason(exc: sf.SoundFileError) -> str:
    """libsndfile's own words, without soundfile's prefix naming a file object."""
    return str(getattr(exc, "error_string", exc)).rstrip(".")


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
    closed = await s.close(keep_events=True)
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
    out_format(args.out)                  # a bad output path fails before the call, not after
    x, rate = read_audio(args.wav)
    async with NodeClient(args.connect) as client:
        await _reach(client, args.timeout)
        try:
            res = await stream(client, args.session, x, rate, args.pace, args.tail,
                               args.instructions)
        except asyncio.TimeoutError:      # `close` unanswered: the node went away mid-call
            raise NodeUnavailable(f"the node at {args.connect} stopped answering") from None
    write_audio(args.out, res.audio, res.rate)
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


async def _reach(client: NodeClient, timeout: float) -> None:
    """A ping before the session: a node that is not there is told apart from one that is slow
    to open a session (a start can take longer than any answer to a ping)."""
    try:
        await client.ping(timeout=timeout)
    except asyncio.TimeoutError:
        raise NodeUnavailable(f"no node answered at {client.endpoint} within {timeout:g} s") \
            from None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--connect", default="tcp://127.0.0.1:5555")
    ap.add_argument("--wav", required=True, help="input audio file (WAV, FLAC, OGG)")
    ap.add_argument("--out", default="reply.wav",
                    help=f"reply file; its extension picks the format ({', '.join(OUT_FORMATS)})")
    ap.add_argument("--session", default=f"wav-{int(time.time())}")
    ap.add_argument("--pace", type=float, default=1.0, help="N times real time")
    ap.add_argument("--tail", type=float, default=1.0, help="seconds to listen after the file")
    ap.add_argument("--timeout", type=float, default=ANSWER_TIMEOUT_S,
                    help="seconds to wait for the node's first answer")
    ap.add_argument("--instructions", default="")
    args = ap.parse_args(argv)
    if args.pace <= 0:
        ap.error("--pace must be > 0")
    if args.timeout <= 0:
        ap.error("--timeout must be > 0")
    try:
        sys.exit(asyncio.run(_main(args)))
    except (AudioFileError, NodeUnavailable) as exc:
        sys.exit(f"wavclient: {exc}")
    except Refused as exc:
        sys.exit(f"wavclient: the node at {args.connect} refused the session: {exc}")
    except zmq.ZMQError as exc:           # e.g. an endpoint zmq cannot parse
        sys.exit(f"wavclient: {args.connect}: {exc}")
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
