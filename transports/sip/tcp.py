"""SIP over TCP (RFC 3261 §18: every SIP element implements UDP and TCP), on the same host and
port as the bridge's UDP socket.

A connection's byte stream is cut into messages by their Content-Length (§18.3: mandatory on a
stream) and each message goes through the same intake as a datagram, with a `TcpPeer` as its
source: it compares and prints as the peer's (host, port) and carries the connection, so every
response, and our in-dialog requests (connection reuse), go back on it. A double CRLF is a
keep-alive ping, answered with one CRLF (RFC 5626 §3.5.1). Requests we send over TCP are not
retransmitted, nor are final responses other than 2xx (§17.1.2.2, §17.2.1); a 2xx to an INVITE
is, until the ACK (§13.3.1.4: a hop further on may be UDP).

A stream that cannot be cut (no Content-Length, a head or body over its bound) is closed, since
nothing after it can be framed, and counted; so is a peer that reads nothing while our writes
pile up. Connections are bounded (`BridgeConfig.tcp_connections`); one past the bound is closed
at once. Nothing a peer sends raises out of the protocol. Our BYE in a dialog whose
connection the caller has closed goes on a new connection to its target (§18.1.1: its Contact
or first route; `dial`). A response for a closed connection is counted (`unsent`) and not sent
on a new one (§18.2.2's SHOULD): a caller that closed its connection mid-transaction resends
its request on a new one.
"""
from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Callable

MAX_HEAD = 64 << 10          # a message's start line and headers, bytes
MAX_BODY = 64 << 10          # its body (an SDP is a few hundred bytes)
MAX_UNSENT = 1 << 20         # our writes a peer has not taken yet, bytes
_LENGTH = re.compile(rb"^(?:content-length|l)[ \t]*:[ \t]*(\d+)[ \t]*$", re.I | re.M)


class TcpPeer(tuple):
    """A SIP peer on a TCP connection: equal to, hashed and printed as its (host, port)."""

    def __new__(cls, host: str, port: int, conn: "SipStream"):
        peer = super().__new__(cls, (host, port))
        peer.conn = conn
        return peer


def reliable(addr) -> bool:
    """Whether messages to `addr` travel on a reliable transport (no retransmission)."""
    return isinstance(addr, TcpPeer)


@dataclass
class TcpStats:
    connections: int = 0            # taken up: accepted, or dialed by us
    refused: int = 0                # closed at once: the bound was reached
    messages: int = 0
    keepalives: int = 0             # pings answered (pongs are only counted)
    framing_errors: int = 0         # streams closed: no Content-Length, or over a bound
    slow_readers: int = 0           # closed: our writes piled up unread
    unsent: int = 0                 # messages for a connection already closed
    dialed: int = 0                 # connections we opened (a BYE whose caller's had closed)
    dial_failed: int = 0


class TcpListener:
    """The bridge's TCP side: `on_message(data, peer)` gets each framed message."""

    def __init__(self, on_message: Callable[[bytes, TcpPeer], None],
                 emit: Callable[..., None], max_connections: int):
        self.on_message, self.emit, self.max_connections = on_message, emit, max_connections
        self.stats = TcpStats()
        self.open: set[SipStream] = set()
        self.server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> None:
        try:
            self.server = await asyncio.get_running_loop().create_server(
                lambda: SipStream(self), host, port)
        except OSError as exc:
            raise OSError(exc.errno, f"SIP over TCP cannot listen on {host}:{port}: "
                          f"{exc.strerror} (--tcp-connections 0 for UDP only)") from None

    async def dial(self, host: str, port: int, timeout: float = 2.0) -> TcpPeer | None:
        """A connection of ours to `host:port`, read like an accepted one; None when it cannot
        be made (refused, unreachable, past the bound: counted)."""
        try:
            _, stream = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
                lambda: SipStream(self), host, port), timeout)
        except (OSError, asyncio.TimeoutError):
            self.stats.dial_failed += 1
            return None
        if stream.closed:                               # past the bound
            self.stats.dial_failed += 1
            return None
        self.stats.dialed += 1
        return stream.peer

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for stream in list(self.open):
            stream.close()


async def listen_both(open_udp: Callable, tcp: TcpListener | None, host: str, port: int):
    """The UDP transport `open_udp()` makes, and TCP on the same port; with port 0, an
    ephemeral port free for both (the UDP one's number may be taken for TCP)."""
    for attempt in range(20):
        transport = await open_udp()
        if tcp is None:
            return transport
        try:
            await tcp.start(host, transport.get_extra_info("sockname")[1])
            return transport
        except OSError:
            transport.close()
            if port or attempt == 19:
                raise


class SipStream(asyncio.Protocol):
    """One TCP connection: bytes in, messages out to the listener; writes for its peer."""

    def __init__(self, listener: TcpListener):
        self.listener, self.stats = listener, listener.stats
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.peer: TcpPeer | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        # None when the peer left before we looked
        host, port = (transport.get_extra_info("peername") or ("", 0))[:2]
        self.peer = TcpPeer(host, port, self)
        if len(self.listener.open) >= self.listener.max_connections:
            self.stats.refused += 1
            self.close()
            return
        self.stats.connections += 1
        self.listener.open.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.listener.open.discard(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.buf += data
        try:
            self._cut()
        except Exception as exc:                      # a bug must not take the bridge down
            self.listener.emit("internal_error", error=repr(exc))
            self.close()

    def send(self, data: bytes) -> bool:
        if self.closed:
            self.stats.unsent += 1
            return False
        self.transport.write(data)
        if self.transport.get_write_buffer_size() > MAX_UNSENT:
            self.stats.slow_readers += 1
            self._close_for("the peer reads nothing of what we send")
            return False
        return True

    def close(self) -> None:
        self.closed = True
        self.listener.open.discard(self)
        if self.transport is not None:
            self.transport.close()

    def _cut(self) -> None:
        buf = self.buf
        while buf and not self.closed:
            if buf[:2] == b"\r\n":
                if buf[:4] == b"\r\n\r\n":            # ping: answer with a pong
                    del buf[:4]
                    self.stats.keepalives += 1
                    self.send(b"\r\n")
                elif len(buf) > 3 or (len(buf) == 3 and buf[2:3] != b"\r"):
                    del buf[:2]                       # a pong, or a stray line end
                else:
                    return                            # maybe half a ping: wait for more
                continue
            end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)    # a longer head is refused even
            if end < 0:                                      # when its end came in one read
                if len(buf) > MAX_HEAD:
                    self._unframed(f"a message head over {MAX_HEAD} bytes")
                return
            length = _LENGTH.search(bytes(buf[:end]))
            if length is None:
                self._unframed("a message without Content-Length (required over TCP)")
                return
            size = int(length.group(1))
            if size > MAX_BODY:
                self._unframed(f"a body of {size} bytes (at most {MAX_BODY})")
                return
            total = end + 4 + size
            if len(buf) < total:
                return
            message = bytes(buf[:total])
            del buf[:total]
            self.stats.messages += 1
            self.listener.on_message(message, self.peer)

    def _unframed(self, why: str) -> None:
        self.stats.framing_errors += 1
        self._close_for(why)

    def _close_for(self, why: str) -> None:
        self.listener.emit("tcp_closed", peer=list(self.peer or ()), reason=why)
        self.close()
