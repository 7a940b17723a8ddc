"""Dialog and transaction state of the bridge, a UAS that also sends BYE (RFC 3261 §12, §17).

`Dialog` is what a 2xx to an INVITE creates: identified by Call-ID, our tag and the caller's tag;
it knows how to address an in-dialog request back to the caller (remote target from Contact,
route set from Record-Route). `InviteTx` is the INVITE server transaction plus the TU's 2xx
retransmission (§13.3.1.4): the last response sent, resent on every retransmitted INVITE, and on
a T1, 2T1 ... T2 schedule until the ACK, for at most 64*T1.
"""
from __future__ import annotations

import asyncio
import ipaddress
import os
from dataclasses import dataclass, field

from transports.sip import message as M
from transports.sip.call import Call


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
        req.add("Via", f"SIP/2.0/UDP {_hostport(via_host, via_port)};branch={new_branch()};rport")
        req.add("Max-Forwards", "70")
        req.add("From", self.local_uri)
        req.add("To", self.remote_uri)
        req.add("Call-ID", self.call_id)
        req.add("CSeq", f"{self.local_cseq} {method}")
        for route in self.route_set:
            req.add("Route", route)
        return req

    def destination(self) -> tuple[str, int]:
        """First route's or the remote target's address if it is an IP literal, else the peer."""
        target = self.remote_target
        if self.route_set:
            try:
                target = M.parse_name_addr(self.route_set[0]).uri
            except ValueError:
                return self.peer
        try:
            uri = M.parse_uri(target)
            ipaddress.ip_address(uri.host)
        except ValueError:
            return self.peer
        return uri.host, uri.port or 5060


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass
class InviteTx:
    request: M.SipMessage
    addr: tuple[str, int]
    local_tag: str
    call: Call | None = None
    dialog: Dialog | None = None
    last: bytes | None = None       # the last response sent (resent on a retransmitted INVITE)
    final: int | None = None        # status of the final response, once sent
    acked: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None    # answering: binding RTP, opening the node session
    expires: float = float("inf")   # when the entry may be forgotten (after the final answer)

    @property
    def key(self) -> tuple[str, int]:
        return tx_key(self.request)


def tx_key(msg: M.SipMessage) -> tuple[str, int]:
    """INVITE, its ACK and its CANCEL share Call-ID and CSeq number."""
    return (msg.get("Call-ID") or "", M.parse_cseq(msg.get("CSeq"))[0])
