"""`python -m transports.realtime`: serve the Realtime WebSocket bridge in front of one node."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import zmq
import zmq.auth

from transports.client import CurveKeys
from transports.client_events import FleetUnavailable
from transports.realtime.feed import FeedPolicy
from transports.realtime.server import Bridge, BridgeConfig
from wave_actors.core.frames import FRAME_MS


def load_z85(path: str, want_secret: bool) -> tuple[bytes, bytes | None]:
    """(public, secret) from a ZPL certificate (zmq.auth) or a file holding one 40-char z85 key."""
    text = Path(path).read_text().strip()
    if "curve" in text and "public-key" in text:
        public, secret = zmq.auth.load_certificate(path)
        if want_secret and secret is None:
            raise SystemExit(f"{path}: certificate has no secret-key")
        return public, secret
    key = text.encode()
    if len(key) != 40:
        raise SystemExit(f"{path}: expected a 40-character z85 key or a ZPL certificate")
    return (zmq.curve_public(key), key) if want_secret else (key, None)


def parse_args(argv: list[str] | None = None) -> BridgeConfig:
    p = argparse.ArgumentParser(prog="python -m transports.realtime", description=__doc__)
    p.add_argument("--node", default="tcp://127.0.0.1:5555", help="the node's ROUTER endpoint")
    p.add_argument("--listen", default="127.0.0.1:8125", help="HOST:PORT to serve on")
    p.add_argument("--path", default="/v1/realtime")
    p.add_argument("--fleet", metavar="ADDRESS",
                   help="a fleet's Ray address (e.g. auto): each call goes to the node its "
                        "directory picks, instead of --node")
    p.add_argument("--api-key", default=os.environ.get("WAVE_API_KEY"),
                   help="key clients must present (default: $WAVE_API_KEY)")
    p.add_argument("--no-auth", action="store_true",
                   help="serve without an API key (only to trusted networks)")
    p.add_argument("--curve-secret", help="this bridge's CURVE secret key (z85 file or cert)")
    p.add_argument("--node-public-key", help="the node's CURVE public key (z85 file or cert)")
    p.add_argument("--max-event-bytes", type=int, default=1 << 20)
    p.add_argument("--outbox-bytes", type=int, default=512 << 10,
                   help="queued audio per connection before deltas are dropped")
    p.add_argument("--stall-grace", type=float, default=10.0,
                   help="seconds a client may leave output unread before it is disconnected")
    p.add_argument("--turn-gap-ms", type=int, default=800,
                   help="transcript quiet that ends a response / user item")
    p.add_argument("--input-queue", type=float, default=FeedPolicy.capacity_s, metavar="S",
                   help="seconds of input a session may queue ahead of the model (appends past "
                        "it get input_audio_buffer_full)")
    p.add_argument("--resume-grace", type=float, default=BridgeConfig.resume_grace_s,
                   metavar="S", help="vllm-omni: how long a dropped socket's session waits for "
                                     "a socket with its session_id")
    p.add_argument("--log-level", default="INFO")
    a = p.parse_args(argv)
    if a.input_queue <= 0 or a.resume_grace <= 0:
        p.error("--input-queue and --resume-grace must be > 0")
    if a.api_key is None and not a.no_auth:
        p.error("set --api-key or WAVE_API_KEY (or --no-auth to serve without one)")
    curve = None
    if bool(a.curve_secret) != bool(a.node_public_key):
        p.error("--curve-secret and --node-public-key go together")
    if a.curve_secret:
        public, secret = load_z85(a.curve_secret, want_secret=True)
        curve = CurveKeys(public, secret, load_z85(a.node_public_key, want_secret=False)[0])
    host, _, port = a.listen.rpartition(":")
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return BridgeConfig(node=a.node, fleet=a.fleet, host=host or "127.0.0.1", port=int(port),
                        path=a.path,
                        api_key=None if a.no_auth else a.api_key, curve=curve,
                        max_event_bytes=a.max_event_bytes,
                        max_frame_bytes=max(4 << 20, 2 * a.max_event_bytes),
                        outbox_bytes=a.outbox_bytes,
                        outbox_hard_bytes=max(4 * a.outbox_bytes, 1 << 20),
                        stall_grace_s=a.stall_grace,
                        turn_gap_frames=max(1, a.turn_gap_ms // FRAME_MS),
                        feed=FeedPolicy(capacity_s=a.input_queue),
                        resume_grace_s=a.resume_grace)


async def serve(cfg: BridgeConfig) -> None:
    bridge = await Bridge(cfg).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"realtime bridge listening on ws://{cfg.host}:{bridge.port}{cfg.path}", flush=True)
    await stop.wait()
    await bridge.stop()


def main(argv: list[str] | None = None) -> None:
    try:
        asyncio.run(serve(parse_args(argv)))
    except FleetUnavailable as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
