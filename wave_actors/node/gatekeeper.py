"""The node's ZAP handler (ZeroMQ RFC 27): every TCP/IPC connection is authenticated here before
the ROUTER attaches it, with or without CURVE.

It gives each connection a number, carried on every message of that connection as the metadata
property `X-Conn`, and with CURVE the client's key as `User-Id`. The node binds each session to
the connection that opened (or resumed) it: a routing identity alone proves nothing, since a
client chooses its own.

Before a new connection is approved, `before_attach` runs: the node uses it to probe every
routing identity that has sessions bound, and a probe that finds no connection detaches that
identity's sessions. A newcomer that takes a vanished client's routing identity is therefore
attached only after those sessions stopped following the identity, and receives nothing of them.
(The ROUTER runs without ROUTER_HANDOVER, so a live connection's identity cannot be taken.)
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from pathlib import Path
from typing import Callable

import zmq
import zmq.asyncio
import zmq.auth
from zmq.utils import z85

log = logging.getLogger("wave.gatekeeper")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
DOMAIN = b"wave"
CONN_PROPERTY = "X-Conn"


def _metadata(props: dict[bytes, bytes]) -> bytes:
    """ZMTP property list: name length (1 byte), name, value length (4 bytes), value."""
    return b"".join(bytes([len(k)]) + k + struct.pack(">I", len(v)) + v for k, v in props.items())


class Gatekeeper:
    def __init__(self, ctx: zmq.asyncio.Context, before_attach: Callable[[], None],
                 curve_dir: Path | None = None):
        self.ctx, self.before_attach = ctx, before_attach
        self.allowed: set[bytes] | None = None          # z85 client keys; None: no CURVE
        if curve_dir is not None:
            self.allowed = set(zmq.auth.load_certificates(str(curve_dir)))
        self._ids = itertools.count(1)
        self.approved = 0
        self.refused = 0
        self._sock: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._sock = self.ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(ZAP_ENDPOINT)
        self._task = asyncio.get_running_loop().create_task(self._serve())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._sock is not None:
            self._sock.close(0)

    async def _serve(self) -> None:
        while True:
            request = await self._sock.recv_multipart()
            try:
                reply = self._answer(request)
            except Exception:                    # a malformed request is refused, never fatal
                log.exception("ZAP request could not be answered")
                reply = [b"1.0", request[1] if len(request) > 1 else b"", b"500",
                         b"internal error", b"", b""]
            await self._sock.send_multipart(reply)

    def _answer(self, request: list[bytes]) -> list[bytes]:
        version, request_id, _domain, address, _identity, mechanism, *credentials = request
        user = b""
        if self.allowed is not None:
            key = z85.encode(credentials[0]) if mechanism == b"CURVE" else None
            if key not in self.allowed:
                self.refused += 1
                log.info("refused a connection from %s (%s)", address.decode(errors="replace"),
                         "key not listed" if key else mechanism.decode(errors="replace"))
                return [version, request_id, b"400", b"key not authorised", b"", b""]
            user = key
        self.before_attach()
        self.approved += 1
        conn = str(next(self._ids)).encode()
        return [version, request_id, b"200", b"OK", user,
                _metadata({CONN_PROPERTY.encode(): conn})]
