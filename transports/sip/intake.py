"""The SIP socket's intake: every datagram parsed, checked and either answered here or handed
to the bridge's handler for its method.

Checks on a request, in RFC 3261 §8.2 order: parse -> version (505) -> mandatory headers (400)
-> method (405/501) -> Require (420) here, then the body in the INVITE handler (415; 400 for
broken SDP; 488 when no codec matches). Garbage that cannot be addressed is counted, never
answered; nothing a datagram holds can raise out of `Intake.on_datagram`. A retransmitted
request gets the response it got before and reaches no handler; OPTIONS is answered here.
"""
from __future__ import annotations

import asyncio
from typing import Callable

from transports.sip import message as M
from transports.sip.dialog import new_tag
from transports.sip.refusals import Refusals, new_invite, warning
from transports.sip.stats import BridgeStats
from transports.sip.transaction import Transactions, tx_key

ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, INFO"
KNOWN_METHODS = ("REGISTER", "UPDATE", "PRACK", "SUBSCRIBE", "NOTIFY", "REFER",
                 "MESSAGE", "PUBLISH")

Handler = Callable[[M.SipMessage, tuple[str, int]], None]


class SipProtocol(asyncio.DatagramProtocol):
    def __init__(self, intake: "Intake"):
        self.intake = intake

    def datagram_received(self, data: bytes, addr) -> None:
        self.intake.on_datagram(data, addr)

    def error_received(self, exc: Exception) -> None:
        pass


class Intake:
    """`handlers` (INVITE, BYE, CANCEL) get the requests that passed every check, `on_ack` the
    ACKs; `send` puts a datagram on the SIP socket."""

    def __init__(self, tx: Transactions, refusals: Refusals, stats: BridgeStats,
                 send: Callable[[bytes, tuple[str, int]], None], emit: Callable[..., None],
                 on_ack: Callable[[M.SipMessage], None], handlers: dict[str, Handler]):
        self.tx, self.refusals, self.stats = tx, refusals, stats
        self.send, self.emit, self.on_ack = send, emit, on_ack
        self.handlers: dict[str, Handler] = {**handlers, "OPTIONS": self._on_options}

    def on_datagram(self, data: bytes, addr: tuple) -> None:
        self.stats.datagrams += 1
        self.on_message(data, addr[:2])

    def on_message(self, data: bytes, addr: tuple) -> None:
        """A datagram's or a TCP stream's message (`addr`: a `tcp.TcpPeer` for the latter)."""
        try:
            self._on_datagram(data, addr)
        except Exception as exc:                      # a bug must not take the bridge down
            self.stats.internal_errors += 1
            self.emit("internal_error", error=repr(exc))

    def _on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        if not data.strip(b"\r\n\t "):
            self.stats.keepalives += 1
            return
        try:
            msg = M.parse(data)
        except M.SipParseError as exc:
            self._bad_request(exc.partial, exc.reason, addr)
            return
        if not msg.is_request:
            self.stats.responses += 1
            if not self.tx.on_response(msg):
                self.stats.stray += 1
            return
        self.stats.requests += 1
        if msg.version != M.SIP_VERSION:
            if msg.get("Via") and msg.method != "ACK":
                self.tx.respond(msg, addr, 505)
                if new_invite(msg):
                    self.refusals.log(msg, addr, 505, "bad_version", msg.version)
            else:
                self.stats.garbage += 1
            return
        reason = M.check_request(msg)
        if reason is not None:
            self._bad_request(msg, reason, addr)
            return
        self._on_request(msg, addr)

    def _bad_request(self, partial: M.SipMessage | None, reason: str, addr) -> None:
        """400 where a response can be addressed (a request with a Via), else count it."""
        if partial is None or not partial.is_request or partial.method == "ACK" \
                or not partial.get("Via"):
            self.stats.garbage += 1
            return
        self.stats.bad_requests += 1
        self.tx.respond(partial, addr, 400, cache=False, headers=[warning(399, reason)])
        if new_invite(partial):
            self.refusals.log(partial, addr, 400, "bad_request", reason)

    def _on_request(self, req: M.SipMessage, addr) -> None:
        method = req.method
        if method == "ACK":
            self.on_ack(req)
            return
        if method == "INVITE" and self._invite_retransmitted(req):
            return
        if method != "INVITE" and (cached := self.tx.cached(req)) is not None:
            self.stats.retransmits_in += 1
            self.send(cached, addr)
            return
        handler = self.handlers.get(method)
        if handler is None:
            status = 405 if method in KNOWN_METHODS else 501
            self.tx.respond(req, addr, status, headers=[("Allow", ALLOW)])
            return
        if method != "CANCEL" and (require := req.get("Require")):
            self.refusals.reject(req, addr, 420, "unsupported_extension",
                                 [("Unsupported", require)], require)
            return
        handler(req, addr)

    def _invite_retransmitted(self, req: M.SipMessage) -> bool:
        """A retransmitted INVITE gets our last response again, and nothing else happens."""
        tx = self.tx.invites.get(tx_key(req))
        if tx is None:
            return False
        self.stats.retransmits_in += 1
        if tx.last is not None:
            self.send(tx.last, tx.addr)
        return True

    def _on_options(self, req: M.SipMessage, addr) -> None:
        self.tx.respond(req, addr, 200, to_tag=new_tag(), headers=[
            ("Allow", ALLOW), ("Accept", "application/sdp"), ("Accept-Language", "en")])
