"""Sample formats of the wire and the phone network: PCM conversion, G.711, streaming resampling.

G.711 follows the ITU-T reference (the segment-search form of Sun's g711.c), vectorised: μ-law
and A-law each become a 65536-entry encode table over every int16 and a 256-entry decode table,
built once with numpy. Resampling is soxr's streaming resampler, one stream per direction, so
chunk boundaries leave no clicks and no samples are lost.
"""
from __future__ import annotations

import numpy as np
import soxr

_INT16 = np.arange(-32768, 32768, dtype=np.int32)


def _segment(value: np.ndarray, ends: np.ndarray) -> np.ndarray:
    return np.searchsorted(ends, value, side="left")      # first segment whose end >= value


def _ulaw_encode(pcm: np.ndarray) -> np.ndarray:
    v = pcm >> 2                                          # 14-bit magnitude domain
    mask = np.where(v < 0, 0x7F, 0xFF)
    v = np.minimum(np.abs(v), 8159) + 0x21
    seg = _segment(v, np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF]))
    code = (seg << 4) | ((v >> (np.minimum(seg, 7) + 1)) & 0xF)
    code = np.where(seg >= 8, 0x7F, code)
    return (code ^ mask).astype(np.uint8)


def _ulaw_decode(code: np.ndarray) -> np.ndarray:
    u = ~code.astype(np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _alaw_encode(pcm: np.ndarray) -> np.ndarray:
    v = pcm >> 3                                          # 13-bit domain
    mask = np.where(v >= 0, 0xD5, 0x55)
    v = np.where(v >= 0, v, -v - 1)
    seg = _segment(v, np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF]))
    shift = np.where(seg < 2, 1, np.minimum(seg, 7))
    code = (seg << 4) | ((v >> shift) & 0xF)
    code = np.where(seg >= 8, 0x7F, code)
    return (code ^ mask).astype(np.uint8)


def _alaw_decode(code: np.ndarray) -> np.ndarray:
    a = code.astype(np.int32) ^ 0x55
    t = (a & 0x0F) << 4
    seg = (a & 0x70) >> 4
    t = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, t, -t).astype(np.int16)


_CODES = np.arange(256, dtype=np.uint8)
ULAW_ENCODE = _ulaw_encode(_INT16)            # index: int16 value + 32768
ALAW_ENCODE = _alaw_encode(_INT16)
ULAW_DECODE = _ulaw_decode(_CODES)            # index: code byte
ALAW_DECODE = _alaw_decode(_CODES)


def ulaw_to_int16(data: bytes | np.ndarray) -> np.ndarray:
    return ULAW_DECODE[np.frombuffer(data, np.uint8)]


def alaw_to_int16(data: bytes | np.ndarray) -> np.ndarray:
    return ALAW_DECODE[np.frombuffer(data, np.uint8)]


def int16_to_ulaw(pcm: np.ndarray) -> bytes:
    return ULAW_ENCODE[pcm.astype(np.int32) + 32768].tobytes()


def int16_to_alaw(pcm: np.ndarray) -> bytes:
    return ALAW_ENCODE[pcm.astype(np.int32) + 32768].tobytes()


def float_to_int16(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x * 32768.0), -32768, 32767).astype(np.int16)   # inverse of decode


def decode(data: bytes, fmt: str) -> np.ndarray:
    """Wire bytes of `fmt` to float32 samples in [-1, 1]. The byte count must be whole samples."""
    if fmt == "pcm_f32le":
        return np.frombuffer(data, "<f4").astype(np.float32)
    if fmt == "pcm_s16le":
        pcm = np.frombuffer(data, "<i2")
    elif fmt == "pcmu":
        pcm = ulaw_to_int16(data)
    elif fmt == "pcma":
        pcm = alaw_to_int16(data)
    else:
        raise ValueError(f"unknown format {fmt!r}")
    return pcm.astype(np.float32) / 32768.0


def _encoded(x: np.ndarray, fmt: str) -> np.ndarray:
    """float32 samples (any shape) as an array of `fmt`'s wire samples, elementwise."""
    if fmt == "pcm_f32le":
        return np.ascontiguousarray(x, "<f4")
    pcm = float_to_int16(x)
    if fmt == "pcm_s16le":
        return pcm.astype("<i2")
    if fmt in ("pcmu", "pcma"):
        return (ULAW_ENCODE if fmt == "pcmu" else ALAW_ENCODE)[pcm.astype(np.int32) + 32768]
    raise ValueError(f"unknown format {fmt!r}")


def encode(x: np.ndarray, fmt: str) -> bytes:
    """float32 samples to wire bytes of `fmt`."""
    return _encoded(x, fmt).tobytes()


def encode_rows(block: np.ndarray, fmt: str) -> list[bytes]:
    """`encode` of each row of [N, samples] as one array operation, then one bytes a row
    (a worker's audio messages of one format and length, each beat)."""
    return [row.tobytes() for row in _encoded(block, fmt)]


class StreamResampler:
    """A streaming resampler for one direction of one session (identity when rates match)."""

    def __init__(self, in_rate: int, out_rate: int):
        self.in_rate, self.out_rate = in_rate, out_rate
        self._stream = (None if in_rate == out_rate else
                        soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ"))

    def __call__(self, x: np.ndarray, last: bool = False) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        if self._stream is None:
            return x
        return self._stream.resample_chunk(x, last=last)
