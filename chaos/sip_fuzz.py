"""A bounded, deterministic fuzzer of the SIP bridge (SIP and RTP over UDP).

    stats = await run("127.0.0.1", 5060, count=300, seed=1)
    # {"tried": 300, "answered": 187, "by_status": {...}, "by_kind": {...}, "rtp_sent": 75, ...}

`plan(count, seed, host, sip_port)` (from `chaos/sip_plan.py`) is the whole attack, a pure
function of its arguments (same seed, same datagrams in the same order; Via and Contact name a
fixed `fuzz.invalid` host, since the bridge answers the source address): `count` SIP datagrams, each built by one mutator of
MUTATORS chosen by `random.Random(seed)` (truncated, huge headers, bad Content-Length, bad SDP,
broken headers and start lines, CANCEL/BYE/ACK for dialogs that do not exist, stray responses,
text and byte garbage), and after every RTP_EVERY-th one an RTP datagram (random bytes, wrong
versions, truncated CSRC lists and extensions, bad padding, RTCP look-alikes, oversize packets,
and valid RTP of random payload type and SSRC), each from one of SOCKS source ports.

`run` first places one well-formed call whose SDP names socket 0, so that the RTP has a port to
hit (without an answer it goes to the SIP port), sends the plan, and hangs that call up. It reads
every response all along: an INVITE answered with an error is ACKed (RFC 3261 §17.1.1.3) so the
bridge stops resending it, one answered 2xx (a mutation that stayed valid) is ACKed and hung up
on so that no fuzz call keeps a node slot, and a request from the bridge (its BYE) gets 200.
Nothing waits unbounded: the control call's answers, the final listening (SETTLE_S at most,
QUIET_S of silence ends it early) and the whole run (`timeout`) are bounded; a run cut short
returns what it counted, with "timed_out": True.
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import random
import socket
from dataclasses import dataclass, field

from chaos.quiet import until_quiet
from chaos.sip_plan import SENT_BY, SOCKS, plan, request, sdp

PACE_S = 0.001               # between datagrams: a fuzzer, not a flood
ANSWER_S = 3.0               # the control call's final answer
SETTLE_S = 2.0               # listening after the last datagram, at most
QUIET_S = 0.3                # ... or until this long without a datagram


# ----------------------------------------------------------------------------- the run

def _parse(data: bytes) -> tuple[str, dict[str, str], bytes] | None:
    """(start line, first value of each header by lower-case full name, body), or None.

    Deliberately independent of the bridge's own parser, which is what is being fuzzed."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("utf-8", "replace").split("\r\n")
    compact = {"v": "via", "f": "from", "t": "to", "i": "call-id", "m": "contact",
               "l": "content-length", "c": "content-type"}
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        name = name.strip().lower()
        if colon:
            headers.setdefault(compact.get(name, name), value.strip())
    return lines[0], headers, body


def _status(start: str) -> int | None:
    parts = start.split(" ", 2)
    if len(parts) >= 2 and parts[0] == "SIP/2.0" and parts[1].isdigit():
        return int(parts[1])
    return None


def _media_port(body: bytes) -> int | None:
    for line in body.decode("utf-8", "replace").splitlines():
        if line.startswith("m=audio "):
            port = line.split()[1]
            return int(port) if port.isdigit() else None
    return None


def _in_dialog(method: str, h: dict[str, str], n: int, host: str, port: int,
               via: str | None = None) -> bytes:
    """An ACK or BYE from a final response's headers (its From/To/Call-ID are the dialog's).
    A non-2xx's ACK reuses the INVITE's Via (`via`); others get a branch of their own, derived
    from the dialog so that no randomness depends on what came back."""
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if via is None:
        digest = hashlib.sha1(f"{method}|{h['call-id']}|{n}".encode()).hexdigest()[:16]
        via = f"SIP/2.0/UDP {SENT_BY};branch=z9hG4bK{digest};rport"
    lines = [f"{method} sip:wave@{target} SIP/2.0", f"Via: {via}", "Max-Forwards: 70",
             f"From: {h.get('from', '')}", f"To: {h.get('to', '')}",
             f"Call-ID: {h['call-id']}", f"CSeq: {n} {method}", "Content-Length: 0"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class _Socket(asyncio.DatagramProtocol):
    def __init__(self, fuzzer: "_Fuzzer", index: int):
        self.fuzzer, self.index, self.transport = fuzzer, index, None

    def connection_made(self, transport):
        self.transport = transport
        self.fuzzer.socks.append(self)

    def datagram_received(self, data, addr):
        self.fuzzer.received(self.index, data, addr)

    def error_received(self, exc):                      # ICMP unreachable: counted, harmless
        self.fuzzer.stats["icmp_errors"] += 1


@dataclass
class _Fuzzer:
    host: str
    port: int
    socks: list[_Socket] = field(default_factory=list)
    stats: collections.Counter = field(default_factory=collections.Counter)
    by_status: collections.Counter = field(default_factory=collections.Counter)
    control: str = ""                                  # Call-ID of the control call
    control_final: tuple | None = None                 # (status, headers, body)
    errors: set = field(default_factory=set)           # (Call-ID, CSeq, status) of 4xx/5xx
    handled: set = field(default_factory=set)          # INVITE finals already ACKed
    last_rx: float = 0.0

    def send(self, sock: int, data: bytes, dest: tuple[str, int]) -> None:
        self.socks[sock].transport.sendto(data, dest)

    def received(self, index: int, data: bytes, addr) -> None:
        self.last_rx = asyncio.get_running_loop().time()
        if data[:1] and data[0] >> 6 == 2:              # RTP version 2: the control call's audio
            self.stats["rtp_in"] += 1
            return
        msg = _parse(data)
        if msg is None:
            self.stats["unparsed_in"] += 1
            return
        start, h, body = msg
        status = _status(start)
        if status is None:                               # the bridge's BYE: say yes
            self.stats["requests_in"] += 1
            reply = ["SIP/2.0 200 OK", *(f"{k.title()}: {h[k]}" for k in
                                         ("via", "from", "to", "call-id", "cseq") if k in h),
                     "Content-Length: 0"]
            self.send(index, ("\r\n".join(reply) + "\r\n\r\n").encode(), addr[:2])
            return
        self.stats["responses"] += 1
        self.by_status[status] += 1
        cid, cseq = h.get("call-id", ""), h.get("cseq", "")
        if 400 <= status < 600 and cid != self.control:
            self.errors.add((cid, cseq, status))
        if status >= 200 and cseq.endswith("INVITE") and cid:
            if cid == self.control and self.control_final is None:
                self.control_final = (status, h, body)
            self._final(index, status, h)

    def _final(self, index: int, status: int, h: dict[str, str]) -> None:
        """ACK an INVITE's final once; hang up a fuzz INVITE that became a call."""
        key = (h["call-id"], h["cseq"], status)
        n = h["cseq"].split()[0]
        if key in self.handled or not n.isdigit():
            return
        self.handled.add(key)
        dest, n = (self.host, self.port), int(n)
        via = h.get("via") if status >= 300 else None
        self.send(index, _in_dialog("ACK", h, n, self.host, self.port, via), dest)
        if status < 300 and h["call-id"] != self.control:
            self.stats["fuzz_calls"] += 1
            self.send(index, _in_dialog("BYE", h, n + 1, self.host, self.port), dest)

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        bind = ("::" if ":" in self.host else "0.0.0.0", 0)
        for i in range(SOCKS):
            await loop.create_datagram_endpoint(lambda i=i: _Socket(self, i), local_addr=bind)

    def close(self) -> None:
        for sock in self.socks:
            if sock.transport is not None:
                sock.transport.close()

    async def call(self, seed: int) -> tuple[str, int] | None:
        """The control call (SDP naming socket 0); where its RTP goes, or None unanswered."""
        rng = random.Random(f"control-{seed}")
        port0 = self.socks[0].transport.get_extra_info("sockname")[1]
        invite = request(rng, "INVITE", self.host, self.port, body=sdp(self._local_ip(), port0))
        self.control = invite.get("Call-ID")
        self.send(0, invite.bytes(), (self.host, self.port))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ANSWER_S
        while self.control_final is None and loop.time() < deadline:
            await asyncio.sleep(0.02)
        status, _, body = self.control_final or (0, {}, b"")
        self.stats["control_status"] = status
        port = _media_port(body) if status == 200 else None
        return None if port is None else (self.host, port)

    def _local_ip(self) -> str:
        """The address our datagrams leave from towards the bridge (what strict RTP sees)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((self.host, self.port))            # UDP: picks a route, sends nothing
            return probe.getsockname()[0]

    def hang_up(self) -> None:
        if self.control_final is not None and self.control_final[0] == 200:
            _, h, _ = self.control_final
            n = int(h["cseq"].split()[0]) + 1
            self.send(0, _in_dialog("BYE", h, n, self.host, self.port), (self.host, self.port))

    async def settle(self) -> None:
        await until_quiet(lambda: self.last_rx, SETTLE_S, QUIET_S)


async def run(host: str, sip_port: int, count: int, seed: int, timeout: float | None = None
              ) -> dict:
    """Send `plan(count, seed, ...)` to the bridge at host:sip_port; counts of what came back.

    "answered" counts distinct fuzz transactions answered 4xx/5xx; "tried" the SIP datagrams
    of the plan; "rtp_sent" its RTP datagrams. Never raises for what the bridge does, never
    runs past `timeout` (default: 15 s plus 20 ms a datagram)."""
    datagrams = plan(count, seed, host, sip_port)
    fuzz = _Fuzzer(host, sip_port)
    by_kind: collections.Counter = collections.Counter()
    sent = collections.Counter()                       # "sip" / "rtp" datagrams sent
    timed_out = False

    async def attack() -> None:
        await fuzz.open()
        rtp_dest = await fuzz.call(seed) or (host, sip_port)
        for d in datagrams:
            fuzz.send(d.sock, d.data, rtp_dest if d.rtp else (host, sip_port))
            by_kind[d.kind] += 1
            sent["rtp" if d.rtp else "sip"] += 1
            await asyncio.sleep(PACE_S)
        fuzz.hang_up()
        await fuzz.settle()

    try:
        await asyncio.wait_for(attack(), timeout or 15.0 + 0.02 * len(datagrams))
    except asyncio.TimeoutError:
        timed_out = True
    finally:
        fuzz.close()
    counted = ("responses", "fuzz_calls", "requests_in", "rtp_in", "unparsed_in",
               "icmp_errors", "control_status")
    return {"tried": sent["sip"], "answered": len(fuzz.errors), "rtp_sent": sent["rtp"],
            **{k: fuzz.stats[k] for k in counted}, "timed_out": timed_out,
            "by_status": dict(sorted(fuzz.by_status.items())), "by_kind": dict(by_kind)}
