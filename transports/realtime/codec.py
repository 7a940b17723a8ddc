"""Audio between the client's formats and the node's native ones, one streaming converter a direction.

The bridge opens every node session at the model's native rates (16 kHz f32 in, 22.05 kHz out),
so the node resamples nothing and the client may change formats mid-session; the conversion
(G.711 / PCM decode, soxr streaming resample, encode) runs here, off the node's process. Where the
client's format equals the node's, bytes pass through untouched (no decode, no copy beyond
base64). soxr emits in blocks, so converted output deltas vary in size around one frame
(1920 samples at 24 kHz: mostly 1785, some 2677); their total tracks the input exactly, less the
resampler's few-ms delay.

Input is cut before it is converted (`Converter.pieces`): a client may append any amount in one
event, and converting first would widen it (G.711 to 16 kHz f32 is 8x) into one node message
past the protocol's limit, which the node's transport answers by dropping the connection that
every session of the bridge shares. Each piece is at most a second of the client's audio and
converts to at most MAX_AUDIO_MESSAGE_BYTES; the streaming resampler makes the cut inaudible.
"""
from __future__ import annotations

from typing import Iterator

from transports import protocol as P
from transports.audio import StreamResampler, decode, encode
from transports.realtime.session import AudioSpec, EventError

MAX_AUDIO_MESSAGE_BYTES = 64 << 10       # one node `audio` message: 1/16 of the protocol's limit
_RESAMPLER_SLACK_BYTES = 8 << 10         # soxr HQ may emit ~1700 samples held from a prior call
assert MAX_AUDIO_MESSAGE_BYTES < P.MAX_PAYLOAD_BYTES


class Converter:
    """`src` bytes -> `dst` bytes, streaming. Whole samples in; may return b'' (resampler fill)."""

    def __init__(self, src: AudioSpec, dst: AudioSpec):
        self.src, self.dst = src, dst
        self.passthrough = src == dst
        self._resample = StreamResampler(src.rate, dst.rate)
        out_per_in = dst.bytes_per_sample * dst.rate / src.rate     # output bytes a source sample
        budget = MAX_AUDIO_MESSAGE_BYTES - (0 if self.passthrough else _RESAMPLER_SLACK_BYTES)
        self.piece_samples = max(1, min(src.rate, int(budget / out_per_in)))

    def __call__(self, data: bytes, last: bool = False) -> bytes:
        """All of `data` converted at once: for output frames, whose size the node bounds."""
        self._check(data)
        if self.passthrough:
            return data
        x = self._resample(decode(data, self.src.fmt), last=last)
        return encode(x, self.dst.fmt) if len(x) else b""

    def pieces(self, data: bytes, last: bool = False) -> Iterator[bytes]:
        """`data` cut into pieces of at most `piece_samples`, each converted as it is taken, and
        any output still over MAX_AUDIO_MESSAGE_BYTES cut again (whole samples); empty pieces
        skipped. Validated here, whole: a bad append raises before any of it is sent. Slices
        are views: a passthrough piece is copied once, into its message."""
        self._check(data)
        return self._pieces(data, last)

    def _pieces(self, data: bytes, last: bool) -> Iterator[bytes]:
        step = self.piece_samples * self.src.bytes_per_sample
        view = memoryview(data) if len(data) > step else None
        for start in range(0, max(len(data), 1), step):
            piece = data if view is None else view[start:start + step]
            yield from self._bounded(self(piece, last=last and start + step >= len(data)))

    def _bounded(self, out: bytes) -> Iterator[bytes]:
        cap = MAX_AUDIO_MESSAGE_BYTES // self.dst.bytes_per_sample * self.dst.bytes_per_sample
        if len(out) <= cap:
            if out:
                yield out
            return
        view = memoryview(out)
        for start in range(0, len(out), cap):
            yield view[start:start + cap]

    def _check(self, data: bytes) -> None:
        if len(data) % self.src.bytes_per_sample:
            raise EventError("invalid_value", f"audio of {len(data)} bytes is not whole samples "
                             f"of {self.src.fmt} ({self.src.bytes_per_sample} bytes each)",
                             "audio")
