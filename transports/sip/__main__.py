"""`python -m transports.sip --node tcp://127.0.0.1:5555 --listen 127.0.0.1:5060`

Answers SIP calls over UDP and carries each one as a session of the node. Prints one JSON line
per event (listening, call_start, bye_sent, call_end with node/jitter/playout stats, stats at
exit) on stdout; stops on SIGINT/SIGTERM after hanging up every call.
"""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
from dataclasses import replace

from transports.sip.config import BridgeConfig
from transports.sip.message import split_hostport
from transports.sip.server import serve


def parse_args(argv=None) -> BridgeConfig:
    ap = argparse.ArgumentParser(prog="python -m transports.sip", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    d = BridgeConfig()
    ap.add_argument("--node", default=d.node, help="the node's ZMQ endpoint")
    ap.add_argument("--listen", default=f"{d.host}:{d.port}", help="SIP UDP host:port")
    ap.add_argument("--media-ip", default="", help="RTP address for SDP (default: listen host)")
    ap.add_argument("--rtp-ports", default="0-0", help="even RTP ports LO-HI (0-0: ephemeral)")
    ap.add_argument("--max-calls", type=int, default=d.max_calls)
    ap.add_argument("--rtp-timeout", type=float, default=d.rtp_timeout,
                    help="seconds without caller RTP before hanging up")
    ap.add_argument("--node-timeout", type=float, default=d.node_timeout)
    ap.add_argument("--open-timeout", type=float, default=d.open_timeout)
    ap.add_argument("--prebuffer-ms", type=int, default=d.playout.prebuffer_ms)
    ap.add_argument("--sip-rcvbuf", type=int, default=d.sip_rcvbuf,
                    help="SIP socket receive buffer, bytes (an INVITE burst waits there)")
    ap.add_argument("--instructions", default="", help="system prompt for every call")
    a = ap.parse_args(argv)
    host, port = split_hostport(a.listen)
    if ipaddress.ip_address(host).is_unspecified and not a.media_ip:
        ap.error("listening on a wildcard address needs --media-ip (the address put in SDP)")
    lo, _, hi = a.rtp_ports.partition("-")
    return BridgeConfig(node=a.node, host=host, port=5060 if port is None else port,
                        media_ip=a.media_ip, rtp_ports=(int(lo), int(hi or lo)),
                        max_calls=a.max_calls, rtp_timeout=a.rtp_timeout,
                        node_timeout=a.node_timeout, open_timeout=a.open_timeout,
                        instructions=a.instructions, sip_rcvbuf=a.sip_rcvbuf,
                        playout=replace(d.playout, prebuffer_ms=a.prebuffer_ms))


async def _main(cfg: BridgeConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await serve(cfg, stop)


def main(argv=None) -> None:
    asyncio.run(_main(parse_args(argv)))


if __name__ == "__main__":
    main()
