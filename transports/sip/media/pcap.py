"""Write RTP packets as a classic pcap file (Ethernet / IPv4 / UDP), e.g. for sipp's
`play_pcap_audio`, which replays the UDP payloads with the capture's timing and rewrites only the
ports and addresses. Also reads such a file back (tests, debugging).
"""
from __future__ import annotations

import socket
import struct
from pathlib import Path

_GLOBAL = struct.Struct("<IHHiIII")       # magic, v2.4, zone, sigfigs, snaplen, linktype
_RECORD = struct.Struct("<IIII")          # ts_sec, ts_usec, incl_len, orig_len
LINKTYPE_ETHERNET = 1


def _ipv4_checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def udp_frame(payload: bytes, src: tuple[str, int], dst: tuple[str, int]) -> bytes:
    """One Ethernet frame holding one IPv4/UDP datagram (UDP checksum 0: none)."""
    udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0,
                     socket.inet_aton(src[0]), socket.inet_aton(dst[0]))
    ip = ip[:10] + struct.pack("!H", _ipv4_checksum(ip)) + ip[12:]
    eth = b"\x00\x00\x00\x00\x00\x02" + b"\x00\x00\x00\x00\x00\x01" + b"\x08\x00"
    return eth + ip + udp


def write(path: str | Path, packets: list[tuple[float, bytes]],
          src: tuple[str, int] = ("127.0.0.1", 6000),
          dst: tuple[str, int] = ("127.0.0.1", 7000)) -> None:
    """`packets`: (time in seconds, UDP payload), written in the order given."""
    out = [_GLOBAL.pack(0xA1B2C3D4, 2, 4, 0, 0, 65535, LINKTYPE_ETHERNET)]
    for t, payload in packets:
        frame = udp_frame(payload, src, dst)
        sec = int(t)
        out.append(_RECORD.pack(sec, int(round((t - sec) * 1e6)), len(frame), len(frame)))
        out.append(frame)
    Path(path).write_bytes(b"".join(out))


def read(path: str | Path) -> list[tuple[float, bytes]]:
    """(time, UDP payload) of every packet of a file written by `write`."""
    data = Path(path).read_bytes()
    magic, *_ , link = _GLOBAL.unpack_from(data)
    if magic != 0xA1B2C3D4 or link != LINKTYPE_ETHERNET:
        raise ValueError("not a little-endian Ethernet pcap")
    pos, out = _GLOBAL.size, []
    while pos < len(data):
        sec, usec, incl, _ = _RECORD.unpack_from(data, pos)
        frame = data[pos + _RECORD.size: pos + _RECORD.size + incl]
        ihl = (frame[14] & 0x0F) * 4
        out.append((sec + usec / 1e6, frame[14 + ihl + 8:]))
        pos += _RECORD.size + incl
    return out
