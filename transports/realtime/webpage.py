"""The bridge's talk page: plain HTTP GETs on the WebSocket's port, answered from
`process_request` before any WebSocket handshake.

`/` is the page (`web/index.html`), `/web/<name>` its script, worklet and style; nothing else
is served, so every other path keeps the bridge's own answers (404, or the Realtime endpoint's
401/426). A WebSocket upgrade is never answered with the page: a client that dials `/` by
mistake still gets the bridge's 404, not an HTML 200 it cannot use.

The Content-Security-Policy lets the page run only its own files: scripts and the AudioWorklet
from this origin (worklets are governed by `script-src`), no inline script or style, and
network access only back to this host, over HTTP(S) for the key check and `ws:`/`wss:` for the
Realtime socket (some browsers do not let `'self'` cover WebSocket schemes).
"""
from __future__ import annotations

import functools
import html
import re
from pathlib import Path
from urllib.parse import urlsplit

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

WEB = Path(__file__).with_name("web")
PAGE_PATH = "/"
# Served path -> (file under web/, Content-Type). A fixed table: no request path reaches the
# filesystem.
FILES = {
    PAGE_PATH: ("index.html", "text/html; charset=utf-8"),
    "/web/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/web/mic-worklet.js": ("mic-worklet.js", "text/javascript; charset=utf-8"),
    "/web/style.css": ("style.css", "text/css; charset=utf-8"),
}
WS_PATH_MARK = "__WAVE_REALTIME_PATH__"      # in index.html: where the page finds the socket
# A Host header that may be echoed into the CSP: a name or IPv4 address and an optional port,
# nothing else (CSP sources cannot name IPv6 literals; `'self'` covers those).
_HOST = re.compile(r"[A-Za-z0-9.-]+(?::[0-9]{1,5})?")


@functools.lru_cache(maxsize=None)
def _read(name: str) -> bytes:
    return (WEB / name).read_bytes()


def csp(host: str | None) -> str:
    same_host = f" ws://{host} wss://{host}" if host and _HOST.fullmatch(host) else ""
    return ("default-src 'none'; script-src 'self'; style-src 'self'; "
            f"connect-src 'self'{same_host}; base-uri 'none'; "
            "form-action 'none'; frame-ancestors 'none'")


def respond(request: Request, ws_path: str) -> Response | None:
    """The page or one of its files for a plain GET of one of `FILES`; None for anything else
    (the caller answers it as before)."""
    path = urlsplit(request.path).path
    if path not in FILES or path.rstrip("/") == ws_path.rstrip("/"):
        return None
    if "websocket" in request.headers.get("Upgrade", "").lower():
        return None
    name, content_type = FILES[path]
    body = _read(name)
    if path == PAGE_PATH:
        body = body.replace(WS_PATH_MARK.encode(), html.escape(ws_path, quote=True).encode())
    headers = Headers([
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Content-Security-Policy", csp(request.headers.get("Host"))),
        ("X-Content-Type-Options", "nosniff"),
        ("Referrer-Policy", "no-referrer"),
        ("Permissions-Policy", "microphone=(self), camera=(), geolocation=()"),
        ("Cross-Origin-Opener-Policy", "same-origin"),
        ("Cache-Control", "no-cache"),
        # websockets closes the TCP connection after a process_request answer; saying so
        # keeps a browser from reusing it for the next file.
        ("Connection", "close"),
    ])
    return Response(200, "OK", headers, body)
