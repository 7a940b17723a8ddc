"""RTP packets (RFC 3550 §5.1): header parse/pack, and the sender state of one outgoing stream.

    0                   1                   2                   3
    |V=2|P|X|  CC   |M|     PT      |       sequence number         |
    |                           timestamp                           |
    |                             SSRC                              |
    |                      CSRC list (CC x 32 bits)                 |
    [header extension: profile (16) | length in words (16) | data]   when X
    [payload] [padding, its last byte = padding count]               when P

RTCP multiplexed on the RTP port (RFC 5761: second byte 200-204) is recognised so that it can be
counted and ignored rather than mistaken for audio.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

_HEADER = struct.Struct("!BBHII")
MAX_RTP = 1500                    # one Ethernet MTU; larger datagrams are not RTP from a phone


class RtpError(ValueError):
    """A datagram that is not an RTP packet."""


@dataclass(frozen=True)
class RtpPacket:
    payload_type: int
    seq: int                      # 16 bits, wraps
    timestamp: int                # 32 bits, wraps
    ssrc: int
    payload: bytes = b""
    marker: bool = False
    csrc: tuple[int, ...] = ()
    extension: tuple[int, bytes] | None = None     # (profile, data: a multiple of 4 bytes)
    padding: int = 0              # padding bytes on the wire (0 = none)

    def pack(self) -> bytes:
        if not 0 <= self.payload_type < 128 or len(self.csrc) > 15:
            raise ValueError("payload type must be 0..127 and at most 15 CSRCs")
        b0 = 0x80 | (0x20 if self.padding else 0) | (0x10 if self.extension else 0) \
            | len(self.csrc)
        out = [_HEADER.pack(b0, (0x80 if self.marker else 0) | self.payload_type,
                            self.seq & 0xFFFF, self.timestamp & 0xFFFFFFFF,
                            self.ssrc & 0xFFFFFFFF)]
        out += [struct.pack("!I", c) for c in self.csrc]
        if self.extension is not None:
            profile, data = self.extension
            if len(data) % 4:
                raise ValueError("header extension data must be whole 32-bit words")
            out.append(struct.pack("!HH", profile, len(data) // 4) + data)
        out.append(self.payload)
        if self.padding:
            if not 1 <= self.padding <= 255:
                raise ValueError("padding must be 1..255 bytes")
            out.append(bytes(self.padding - 1) + bytes([self.padding]))
        return b"".join(out)


def is_rtcp(data: bytes) -> bool:
    """RTCP multiplexed on the RTP port: packet types 200..204 sit where M+PT would be.

    The whole first header must also hold together (RFC 3550 §6.4: packets are 32-bit words, the
    length field counts the words after the first), so that a short garbage datagram whose second
    byte happens to be 200..204 is counted as bad RTP, not as RTCP.
    """
    if len(data) < 8 or len(data) % 4 or data[0] >> 6 != 2 or not 200 <= data[1] <= 204:
        return False
    words = int.from_bytes(data[2:4], "big") + 1
    return 4 * words <= len(data)


def parse(data: bytes) -> RtpPacket:
    if len(data) < _HEADER.size:
        raise RtpError(f"{len(data)} bytes is shorter than an RTP header")
    if len(data) > MAX_RTP:
        raise RtpError(f"{len(data)} bytes is larger than {MAX_RTP}")
    b0, b1, seq, ts, ssrc = _HEADER.unpack_from(data)
    if b0 >> 6 != 2:
        raise RtpError(f"RTP version {b0 >> 6}, expected 2")
    cc, pos = b0 & 0x0F, _HEADER.size
    if len(data) < pos + 4 * cc:
        raise RtpError("truncated CSRC list")
    csrc = struct.unpack_from(f"!{cc}I", data, pos)
    pos += 4 * cc
    extension = None
    if b0 & 0x10:
        if len(data) < pos + 4:
            raise RtpError("truncated header extension")
        profile, words = struct.unpack_from("!HH", data, pos)
        if len(data) < pos + 4 + 4 * words:
            raise RtpError("truncated header extension data")
        extension = (profile, bytes(data[pos + 4:pos + 4 + 4 * words]))
        pos += 4 + 4 * words
    end, padding = len(data), 0
    if b0 & 0x20:
        padding = data[-1]
        if padding == 0 or pos + padding > end:
            raise RtpError(f"bad padding count {padding}")
        end -= padding
    return RtpPacket(b1 & 0x7F, seq, ts, ssrc, bytes(data[pos:end]), bool(b1 & 0x80),
                     tuple(csrc), extension, padding)


class RtpSender:
    """Sequence number, timestamp and SSRC of one outgoing stream; random starts (RFC 3550 §5.1).

    Invariants: seq rises by 1 per packet sent; timestamp rises by the samples of every tick,
    sent or skipped, so it tracks the sampling clock; marker is set on the first packet only.
    """

    def __init__(self, payload_type: int, ssrc: int | None = None, seq: int | None = None,
                 timestamp: int | None = None):
        rnd = lambda bits: int.from_bytes(os.urandom(4), "big") & ((1 << bits) - 1)  # noqa: E731
        self.payload_type = payload_type
        self.ssrc = rnd(32) if ssrc is None else ssrc
        self.seq = rnd(16) if seq is None else seq
        self.timestamp = rnd(32) if timestamp is None else timestamp
        self.sent = 0
        self.octets = 0

    def packet(self, payload: bytes, samples: int) -> bytes:
        """The next packet carrying `payload` (`samples` long); advances seq and timestamp."""
        pkt = RtpPacket(self.payload_type, self.seq, self.timestamp, self.ssrc, payload,
                        marker=self.sent == 0)
        self.seq = (self.seq + 1) & 0xFFFF
        self.timestamp = (self.timestamp + samples) & 0xFFFFFFFF
        self.sent += 1
        self.octets += len(payload)
        return pkt.pack()

    def skip(self, samples: int) -> None:
        """A tick with nothing sent: time moves on, the sequence does not."""
        self.timestamp = (self.timestamp + samples) & 0xFFFFFFFF
