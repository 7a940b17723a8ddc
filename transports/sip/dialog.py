"""Dialog state of the bridge, a UAS that also sends BYE (RFC 3261 §12).

A `Dialog` is what a 2xx to an INVITE creates: identified by Call-ID, our tag and the caller's
tag; it builds in-dialog requests back to the caller (remote target from Contact, route set from
Record-Route, our CSeq rising) and knows where to send them.
"""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

from transports.sip import message as M
from transports.sip.call import Call
from transports.sip.tcp import reliable


def new_tag() -> str:
    return os.urandom(6).hex()


def new_branch() -> str:
    return "z9hG4bK" + os.urandom(8).hex()       # RFC 3261 magic cookie


@dataclass
class Dialog:
    call_id: str
    local_tag: str
    remote_tag: str
    local_uri: str                  # the INVITE's To value, our tag added: From of our requests
    remote_uri: str                 # the INVITE's From value: To of our requests
    remote_target: str              # Contact URI of the caller
    route_set: list[str]            # Record-Route values, in order (we are the UAS)
    peer: tuple[str, int]           # where the INVITE came from
    remote_cseq: int
    call: Call
    local_cseq: int = 1
    confirmed: bool = False         # ACK received
    ending: bool = False            # a BYE is on its way (ours or theirs)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.call_id, self.local_tag, self.remote_tag)

    def request(self, method: str, via_host: str, via_port: int) -> M.SipMessage:
        """An in-dialog request from us to the caller (§12.2.1.1)."""
        self.local_cseq += 1
        req = M.SipMessage(method=method, uri=self.remote_target)
        via = "TCP" if reliable(self.peer) else "UDP"
        req.add("Via", f"SIP/2.0/{via} {hostport(via_host, via_port)};branch={new_branch()};rport")
        req.add("Max-Forwards", "70")
        req.add("From", self.local_uri)
        req.add("To", self.remote_uri)
        req.add("Call-ID", self.call_id)
        req.add("CSeq", f"{self.local_cseq} {method}")
        for route in self.route_set:
            req.add("Route", route)
        return req

    def destination(self) -> tuple[str, int]:
        """The peer's TCP connection while it is open (reused); else the first route's or the
        remote target's address if it is an IP literal, else the peer's address (over TCP,
        where a new connection goes)."""
        if reliable(self.peer) and not self.peer.conn.closed:
            return self.peer
        target = self.remote_target
        if self.route_set:
            try:
                target = M.parse_name_addr(self.route_set[0]).uri
            except ValueError:
                return tuple(self.peer)
        try:
            uri = M.parse_uri(target)
            ipaddress.ip_address(uri.host)
        except ValueError:
            return tuple(self.peer)
        return uri.host, uri.port or 5060


def hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
