"""The Realtime WebSocket bridge: one node session per WebSocket connection at `/v1/realtime`
(each a `Connection`, `connection.py`: its reader, feeder, pump and writer, its bounded
outbox and input feed). All connections share one `NodeClient` (one DEALER socket). The
node session opens on the first `session.update` or the first audio,
whichever comes first, with the session's instructions and tools; it always runs at the model's
native rates and the bridge converts (codec.py).
"""
from __future__ import annotations

import hmac
import json
import logging
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Response

from transports import client as C
from transports.connect import connect_to
from wave_actors.core.heap import Trimmer
from transports.realtime.connection import Connection
from transports.realtime import webpage
from transports.realtime.config import BridgeConfig

log = logging.getLogger("wave.realtime")


def _offered_key(conn: ServerConnection, request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    query = parse_qs(urlsplit(request.path).query)
    if query.get("api_key"):
        return query["api_key"][0]
    for proto in request.headers.get_all("Sec-WebSocket-Protocol"):   # browsers: no headers
        for p in proto.split(","):
            if p.strip().startswith("openai-insecure-api-key."):
                return p.strip()[len("openai-insecure-api-key."):]
    return None


def _reject(status: int, code: str, message: str) -> Response:
    body = json.dumps({"error": {"type": "invalid_request_error", "code": code,
                                 "message": message}}).encode()
    headers = Headers([("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="wave realtime"'
    return Response(status, {401: "Unauthorized", 404: "Not Found"}[status], headers, body)


class Bridge:
    def __init__(self, cfg: BridgeConfig):
        self.cfg = cfg
        self.client: C.NodeClient | None = None
        self.server = None
        self.connections: set[Connection] = set()
        self.trimmer = Trimmer()        # a connection's frames freed: their pages go back
        # vllm-omni sessions by their `session_id`: live ones (a second socket naming one is
        # refused) and parked ones (their socket dropped; a socket naming one takes it over)
        self.named: dict[str, Connection] = {}
        # audio_*: node `audio` messages sent for client appends; the largest stays under
        # codec.MAX_AUDIO_MESSAGE_BYTES whatever a client appends
        self.totals = {"connections": 0, "dropped_deltas": 0, "aborted_slow": 0,
                       "audio_messages": 0, "audio_bytes": 0, "largest_audio_message": 0,
                       "silence_bytes": 0, "input_refused_bytes": 0, "input_cleared_bytes": 0,
                       "input_unheard_bytes": 0, "resumed": 0, "parked_events_dropped": 0}

    async def start(self) -> "Bridge":
        self.client = connect_to(self.cfg.node, self.cfg.fleet, self.cfg.curve)
        self.client.connect()
        self.server = await serve(
            self._handle, self.cfg.host, self.cfg.port, process_request=self._authorize,
            select_subprotocol=lambda _, offered: "realtime" if "realtime" in offered else None,
            max_size=self.cfg.max_frame_bytes, compression=None, server_header="wave-realtime")
        log.info("realtime bridge on ws://%s:%d%s -> node %s", self.cfg.host, self.port,
                 self.cfg.path, self.cfg.node)
        return self

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.trimmer.cancel()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        if self.client is not None:
            await self.client.aclose()

    def _authorize(self, conn: ServerConnection, request) -> Response | None:
        page = webpage.respond(request, self.cfg.path)     # the talk page: plain GETs only
        if page is not None:
            return page
        if urlsplit(request.path).path.rstrip("/") != self.cfg.path:
            return _reject(404, "not_found", f"the Realtime endpoint is {self.cfg.path}")
        key = self.cfg.api_key
        offered = _offered_key(conn, request)
        if key is not None and (offered is None or
                                not hmac.compare_digest(offered.encode(), key.encode())):
            what = "missing" if offered is None else "invalid"
            return _reject(401, "invalid_api_key", f"{what} API key: send `Authorization: Bearer "
                           "<key>` or `?api_key=<key>`")
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        conn = Connection(self, ws)
        self.totals["connections"] += 1
        held = self.named.get(conn.dialect.session_id) if conn.dialect.vllm_omni else None
        if held is not None and held.parked:
            conn = held                       # the same session, on this socket from now on
            self.totals["resumed"] += 1
        self.connections.add(conn)
        try:
            await conn.run(ws)
        finally:
            self.trimmer.soon()
            if not conn.parked:
                self.connections.discard(conn)
                if self.named.get(conn.dialect.session_id) is conn:
                    del self.named[conn.dialect.session_id]
