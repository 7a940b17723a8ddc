"""`python -m transports.sip --node tcp://127.0.0.1:5555 --listen 127.0.0.1:5060`

Answers SIP calls over UDP and TCP (one port) and carries each one as a session of the node.
Prints one JSON line per event (listening, call_start, call_refused with Call-ID/from/reason/
status, dtmf for each key a caller presses, bye_sent, call_end with node/jitter/playout/dtmf
stats, stats at exit) on stdout; stops on SIGINT/SIGTERM after hanging up every call.

A call refused for capacity (--max-calls reached, or every node slot taken) gets
503 Service Unavailable with Retry-After by default, so that a proxy tries another server and
keeps away from this one for that long; --capacity-status 486 answers Busy Here instead.
Other transient refusals (node draining or not answering, no RTP port) get 503 with Retry-After
too; lasting ones (the node refuses our open as invalid or unauthorised) get 503 without it.
"""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
import sys
from dataclasses import replace

from transports.client_events import FleetUnavailable
from transports.sip.config import CAPACITY_STATUSES, MAX_RETRY_AFTER, BridgeConfig
from transports.sip.message import split_hostport
from transports.sip.server import serve


def parse_args(argv=None) -> BridgeConfig:
    ap = argparse.ArgumentParser(prog="python -m transports.sip", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    d = BridgeConfig()
    ap.add_argument("--node", default=d.node, help="the node's ZMQ endpoint")
    ap.add_argument("--fleet", metavar="ADDRESS",
                    help="a fleet's Ray address (e.g. auto): each call goes to the node its "
                         "directory picks, instead of --node")
    ap.add_argument("--listen", default=f"{d.host}:{d.port}",
                    help="SIP host:port, for UDP and TCP alike")
    ap.add_argument("--media-ip", default="", help="RTP address for SDP (default: listen host)")
    ap.add_argument("--rtp-ports", default="0-0", help="even RTP ports LO-HI (0-0: ephemeral)")
    ap.add_argument("--max-calls", type=int, default=d.max_calls)
    ap.add_argument("--tcp-connections", type=int, default=d.tcp_connections, metavar="N",
                    help="SIP over TCP: connections at once (0: UDP only; default: "
                         "%(default)s)")
    ap.add_argument("--capacity-status", type=int, choices=CAPACITY_STATUSES,
                    default=d.capacity_status,
                    help="status for a call refused for capacity: 503 Service Unavailable "
                         "(proxies fail over) or 486 Busy Here (default: %(default)s)")
    ap.add_argument("--retry-after", type=_retry_after, default=d.retry_after,
                    metavar="SECONDS",
                    help="Retry-After on capacity and other transient refusals, whole seconds "
                         f"0..{MAX_RETRY_AFTER}; 0 sends none (default: %(default)s)")
    ap.add_argument("--no-telephone-event", action="store_true",
                    help="do not agree RFC 4733 DTMF events (telephone-event): phones then send "
                         "keys as SIP INFO, in the audio as tones, or not at all")
    ap.add_argument("--rtp-timeout", type=float, default=d.rtp_timeout,
                    help="seconds without caller RTP before hanging up")
    ap.add_argument("--node-timeout", type=float, default=d.node_timeout)
    ap.add_argument("--open-timeout", type=float, default=d.open_timeout)
    ap.add_argument("--prebuffer-ms", type=int, default=d.playout.prebuffer_ms)
    ap.add_argument("--sip-rcvbuf", type=int, default=d.sip_rcvbuf,
                    help="SIP socket receive buffer, bytes (an INVITE burst waits there)")
    ap.add_argument("--instructions", default="", help="system prompt for every call")
    a = ap.parse_args(argv)
    try:
        host, port = split_hostport(a.listen)
        wildcard = ipaddress.ip_address(host).is_unspecified
    except ValueError as exc:
        ap.error(f"--listen {a.listen!r}: {exc} (an IP address and a port, e.g. "
                 "0.0.0.0:5060)")
    if wildcard and not a.media_ip:
        ap.error("listening on a wildcard address needs --media-ip (the address put in SDP)")
    if a.tcp_connections < 0:
        ap.error("--tcp-connections must be 0 (UDP only) or more")
    lo, _, hi = a.rtp_ports.partition("-")
    return BridgeConfig(node=a.node, fleet=a.fleet, host=host,
                        port=5060 if port is None else port,
                        media_ip=a.media_ip, rtp_ports=(int(lo), int(hi or lo)),
                        max_calls=a.max_calls, tcp_connections=a.tcp_connections,
                        capacity_status=a.capacity_status,
                        retry_after=a.retry_after, telephone_event=not a.no_telephone_event,
                        rtp_timeout=a.rtp_timeout,
                        node_timeout=a.node_timeout, open_timeout=a.open_timeout,
                        instructions=a.instructions, sip_rcvbuf=a.sip_rcvbuf,
                        playout=replace(d.playout, prebuffer_ms=a.prebuffer_ms))


def _retry_after(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not whole seconds") from None
    if not 0 <= value <= MAX_RETRY_AFTER:
        raise argparse.ArgumentTypeError(f"{value} is not in 0..{MAX_RETRY_AFTER}")
    return value


async def _main(cfg: BridgeConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await serve(cfg, stop)


def main(argv=None) -> None:
    try:
        asyncio.run(_main(parse_args(argv)))
    except (FleetUnavailable, OSError) as exc:      # no fleet; a SIP port taken
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
