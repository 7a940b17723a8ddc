"""Kernel UDP buffer sizes: ask for them, read back what was granted, say when it was clamped.

A burst of datagrams that arrives while the event loop is busy waits in the socket's receive
buffer; what does not fit is dropped by the kernel unseen (SIP recovers only by the caller's
retransmission, T1 = 500 ms later; RTP not at all). Linux doubles the requested size (for its
bookkeeping) and caps the request at net.core.rmem_max / wmem_max; SO_RCVBUFFORCE /
SO_SNDBUFFORCE pass the cap but need CAP_NET_ADMIN, so they are tried only when the plain option
was clamped, and a refusal is quiet.
"""
from __future__ import annotations

import socket
import sys
from dataclasses import dataclass

_LINUX = sys.platform.startswith("linux")
_OPTIONS = {   # name -> (option, its FORCE twin on Linux: 33/32, absent from the socket module)
    "rcvbuf": (socket.SO_RCVBUF, 33 if _LINUX else None),
    "sndbuf": (socket.SO_SNDBUF, 32 if _LINUX else None),
}


@dataclass(frozen=True)
class Buffer:
    name: str                  # "rcvbuf" or "sndbuf"
    wanted: int                # bytes asked for
    granted: int               # bytes the kernel holds to (its report, halved on Linux)

    @property
    def clamped(self) -> bool:
        return self.granted < self.wanted


def granted(sock, name: str) -> int:
    value = sock.getsockopt(socket.SOL_SOCKET, _OPTIONS[name][0])
    return value // 2 if _LINUX else value


def size(sock, name: str, wanted: int) -> Buffer:
    """Ask for `wanted` bytes of buffer `name` (0: leave the kernel's default)."""
    if wanted > 0:
        for option in _OPTIONS[name]:
            if option is None:
                continue
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, wanted)
            except OSError:            # EPERM for FORCE without CAP_NET_ADMIN: keep the cap
                continue
            if granted(sock, name) >= wanted:
                break
    return Buffer(name, wanted, granted(sock, name))


def size_sip(sock, rcvbuf: int, sndbuf: int, emit) -> list[Buffer]:
    """The SIP socket's buffers: room for an INVITE burst (see BridgeConfig.sip_rcvbuf). A clamp
    is logged, since it turns a burst into losses that only the callers' retransmissions
    repair."""
    buffers = [size(sock, "rcvbuf", rcvbuf), size(sock, "sndbuf", sndbuf)]
    for b in buffers:
        if b.clamped:
            emit("socket_buffer_clamped", socket="sip", buffer=b.name, wanted=b.wanted,
                 granted=b.granted,
                 limit="net.core.rmem_max" if b.name == "rcvbuf" else "net.core.wmem_max")
    return buffers
