"""Audio between the client's formats and the node's native ones, one streaming converter a direction.

The bridge opens every node session at the model's native rates (16 kHz f32 in, 22.05 kHz out),
so the node resamples nothing and the client may change formats mid-session; the conversion
(G.711 / PCM decode, soxr streaming resample, encode) runs here, off the node's process. Where the
client's format equals the node's, bytes pass through untouched (no decode, no copy beyond
base64). soxr emits in blocks, so converted output deltas vary in size around one frame
(1920 samples at 24 kHz: mostly 1785, some 2677); their total tracks the input exactly, less the
resampler's few-ms delay.
"""
from __future__ import annotations

from transports.audio import StreamResampler, decode, encode
from transports.realtime.session import AudioSpec, EventError


class Converter:
    """`src` bytes -> `dst` bytes, streaming. Whole samples in; may return b'' (resampler fill)."""

    def __init__(self, src: AudioSpec, dst: AudioSpec):
        self.src, self.dst = src, dst
        self.passthrough = src == dst
        self._resample = StreamResampler(src.rate, dst.rate)

    def __call__(self, data: bytes, last: bool = False) -> bytes:
        if len(data) % self.src.bytes_per_sample:
            raise EventError("invalid_value", f"audio of {len(data)} bytes is not whole samples "
                             f"of {self.src.fmt} ({self.src.bytes_per_sample} bytes each)",
                             "audio")
        if self.passthrough:
            return data
        x = self._resample(decode(data, self.src.fmt), last=last)
        return encode(x, self.dst.fmt) if len(x) else b""
