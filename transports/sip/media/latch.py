"""Strict RTP: the one source address a call's media is accepted from (like Asterisk's strictrtp).

RTP carries no authentication: whoever learns or guesses a call's RTP port can talk into it. So
a call takes media from one source (address and port) at a time:

- the address of the caller's SDP (`c=` and `m=`), latched as soon as an answer is agreed, when
  that address is usable;
- otherwise (no SDP yet, `c=0.0.0.0`, or a non-global address while the signalling came from a
  global one: a caller behind a NAT that cannot know its public RTP address) the first source
  that sends a valid RTP packet of the negotiated payload type is learned and latched.

Datagrams from every other source are dropped (the call counts them). SSRC changes from the
latched source are not this module's business: a PBX that re-anchors media keeps its address and
changes SSRC, and the jitter buffer resyncs on that after two packets.

A new answer (re-INVITE, or the caller's answer in an ACK) with a usable address re-latches to
it. A hold (`c=0.0.0.0`) or the same unusable address again keeps the source already latched, so
that a call on hold cannot be taken over by whoever sends first; a new unusable address (the
caller moved behind a NAT) starts learning again.
"""
from __future__ import annotations

import ipaddress

Address = tuple[str, int]


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return None


def normalise(addr) -> Address:
    """(host, port[, flow, scope]) from a socket, or an SDP pair -> one comparable form."""
    ip = _ip(addr[0])
    return (str(ip) if ip is not None else addr[0], int(addr[1]))


def usable(remote: Address | None, signalling_host: str | None) -> bool:
    """Whether an SDP media address can be trusted as the place the caller sends from."""
    if remote is None or not 0 < remote[1] < 65536:
        return False
    ip = _ip(remote[0])
    if ip is None or ip.is_unspecified or ip.is_multicast:
        return False
    sig = _ip(signalling_host or "")
    return sig is None or ip.is_global or not sig.is_global


class SourceLatch:
    """Invariant: `source` is None only while learning; then the next valid packet's address
    becomes the source. `_offered` is the SDP address the latch was last told about."""

    def __init__(self, signalling_host: str | None = None):
        self.signalling_host = signalling_host
        self.source: Address | None = None
        self.learned = False              # source came from the first packet, not from SDP
        self.changes = 0                  # times the source was set (answers and learning)
        self._offered: Address | None = None

    def expect(self, remote: Address | None) -> None:
        """A new offer/answer agreed on `remote` (None: on hold, or no SDP answer yet)."""
        remote = None if remote is None else normalise(remote)
        if usable(remote, self.signalling_host):
            if remote != self.source:
                self.source, self.learned = remote, False
                self.changes += 1
        elif remote is None:             # on hold: nothing new about where media comes from
            return
        elif remote != self._offered:
            self.source, self.learned = None, False
        self._offered = remote

    def admits(self, addr) -> bool:
        # the kernel's address strings are canonical already: parse only on a mismatch
        return self.source is None or tuple(addr[:2]) == self.source or \
            normalise(addr) == self.source

    def learn(self, addr) -> None:
        """A valid RTP packet from `addr` was admitted: latch to it if still learning."""
        if self.source is None:
            self.source, self.learned = normalise(addr), True
            self.changes += 1
