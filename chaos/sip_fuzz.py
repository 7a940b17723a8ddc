"""A bounded, deterministic fuzzer of the SIP bridge (SIP and RTP over UDP).

    stats = await run("127.0.0.1", 5060, count=300, seed=1)
    # {"tried": 300, "answered": 187, "by_status": {...}, "by_kind": {...}, "rtp_sent": 75, ...}

`plan(count, seed, host, sip_port)` is the whole attack, a pure function of its arguments (same
seed, same datagrams in the same order; Via and Contact name a fixed `fuzz.invalid` host, since
the bridge answers the source address): `count` SIP datagrams, each built by one mutator of
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
import struct
from dataclasses import dataclass, field

from chaos.quiet import until_quiet

SOCKS = 3
RTP_EVERY = 4                # one RTP datagram after every 4th SIP one
PACE_S = 0.001               # between datagrams: a fuzzer, not a flood
ANSWER_S = 3.0               # the control call's final answer
SETTLE_S = 2.0               # listening after the last datagram, at most
QUIET_S = 0.3                # ... or until this long without a datagram
MAX_DATAGRAM = 65_000        # under UDP's 65,507-byte payload limit
SENT_BY = "fuzz.invalid:5060"


@dataclass(frozen=True)
class Datagram:
    kind: str
    sock: int                # which source socket sends it
    data: bytes
    rtp: bool = False        # to the call's RTP port (else the SIP port)


@dataclass
class _Msg:
    """A request under construction: mutators edit lines, then `bytes` frames it."""
    start: str
    headers: list[list[str]]
    body: bytes = b""
    length: str | None = None            # Content-Length override (None: the true length)

    def get(self, name: str) -> str:
        return next(v for n, v in self.headers if n == name)

    def bytes(self) -> bytes:
        length = str(len(self.body)) if self.length is None else self.length
        lines = [self.start, *(f"{n}: {v}" for n, v in self.headers), f"Content-Length: {length}"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + self.body


def _hex(rng: random.Random, bits: int) -> str:
    return f"{rng.getrandbits(bits):0{bits // 4}x}"


def sdp(ip: str, port: int, fmt: int = 0, name: str = "PCMU") -> bytes:
    fam = "IP6" if ":" in ip else "IP4"
    return (f"v=0\r\no=fuzz 1 1 IN {fam} {ip}\r\ns=-\r\nc=IN {fam} {ip}\r\nt=0 0\r\n"
            f"m=audio {port} RTP/AVP {fmt}\r\na=rtpmap:{fmt} {name}/8000\r\n"
            f"a=ptime:20\r\n").encode()


def request(rng: random.Random, method: str, host: str, port: int, *, body: bytes = b"",
            to_tag: str = "", call_id: str | None = None) -> _Msg:
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    headers = [["Via", f"SIP/2.0/UDP {SENT_BY};branch=z9hG4bK{_hex(rng, 64)};rport"],
               ["Max-Forwards", "70"],
               ["From", f"<sip:fuzz@fuzz.invalid>;tag={_hex(rng, 32)}"],
               ["To", f"<sip:wave@{target}>" + (f";tag={to_tag}" if to_tag else "")],
               ["Call-ID", call_id or f"fuzz-{_hex(rng, 64)}"],
               ["CSeq", f"{rng.randint(1, 2**31 - 1)} {method}"],
               ["Contact", f"<sip:fuzz@{SENT_BY}>"]]
    if body:
        headers.append(["Content-Type", "application/sdp"])
    return _Msg(f"{method} sip:wave@{target} SIP/2.0", headers, body)


# ----------------------------------------------------------------------------- SIP mutators
# Each takes (rng, host, port) and returns the datagram's bytes.

def _invite(rng, host, port) -> _Msg:
    return request(rng, "INVITE", host, port, body=sdp(host, 9))


def _truncated(rng, host, port):
    data = rng.choice([_invite, _options])(rng, host, port).bytes()
    return data[:rng.randrange(1, len(data))]


def _options(rng, host, port) -> _Msg:
    return request(rng, "OPTIONS", host, port)


def _huge_header(rng, host, port):
    msg = rng.choice([_invite, _options])(rng, host, port)
    if rng.random() < 0.5:
        msg.headers.insert(rng.randrange(len(msg.headers)),
                           ["X-Fuzz", "A" * rng.randrange(1000, MAX_DATAGRAM - 1500)])
    else:                                               # more headers than any parser allows
        msg.headers += [[f"X-F{i}", _hex(rng, 32)] for i in range(rng.randrange(100, 400))]
    return msg.bytes()[:MAX_DATAGRAM]


def _bad_content_length(rng, host, port):
    msg = _invite(rng, host, port)
    n = len(msg.body)
    msg.length = rng.choice(["-1", str(n + 40), str(n - 40), "99999999999", "abc", "", "0x10",
                             f"{n}, {n}", f"{n} 7"])
    return msg.bytes()


def _bad_sdp(rng, host, port):
    lines = sdp(host, 9).decode().split("\r\n")[:-1]
    how = rng.randrange(7)
    if how == 0:
        del lines[rng.randrange(len(lines))]
    elif how == 1:
        lines[rng.randrange(len(lines))] = _hex(rng, 64)
    elif how == 2:
        lines[3] = rng.choice(["c=IN IP4 999.1.1.1", "c=IN IP9 x", "c=", "c=IN IP4 ::1"])
    elif how == 3:
        lines[5] = rng.choice(["m=audio 70000 RTP/AVP 0", "m=audio -1 RTP/AVP 0",
                               "m=audio x RTP/AVP 0", "m=audio 9", "m=video 9 RTP/AVP 96",
                               "m=audio 9 RTP/AVP 18", "m=audio 9 RTP/SAVP 0"])
    elif how == 4:
        lines += ["a=rtpmap:0", "a=ptime:-20", "a=sendonly", "a=recvonly"]
    elif how == 5:
        lines = [ln.replace("=", "") for ln in lines]
    else:
        lines.insert(rng.randrange(len(lines)), "\x00\xff\x80")
    return request(rng, "INVITE", host, port,
                   body="\r\n".join(lines).encode("utf-8", "surrogateescape")).bytes()


def _no_dialog(rng, host, port):
    method = rng.choice(["CANCEL", "BYE", "ACK", "INVITE"])        # INVITE: a stray re-INVITE
    body = sdp(host, 9) if method == "INVITE" else b""
    return request(rng, method, host, port, body=body, to_tag=_hex(rng, 32)).bytes()


def _bad_header(rng, host, port):
    msg = rng.choice([_invite, _options])(rng, host, port)
    names = [n for n, _ in msg.headers]
    how = rng.randrange(8)
    if how == 0:                                       # a mandatory header missing
        del msg.headers[names.index(rng.choice(["Via", "From", "To", "Call-ID", "CSeq"]))]
    elif how == 1:
        msg.headers[names.index("CSeq")][1] = rng.choice(
            ["abc INVITE", "1 BYE", "-5 INVITE", "99999999999 INVITE", "1", ""])
    elif how == 2:
        msg.headers[names.index("Via")][1] = rng.choice(
            ["SIP/2.0/UDP", "garbage", "SIP/2.0/UDP h;branch=", "SIP/2.0/TCP [::1;branch=x"])
    elif how == 3:
        msg.headers[names.index(rng.choice(["From", "To", "Contact"]))][1] = rng.choice(
            ["<sip:unterminated", "<>", "sip:", '"quote <sip:a@b>', ";tag=", "<sip:a@b>;tag"])
    elif how == 4:
        msg.headers[names.index("Max-Forwards")][1] = rng.choice(["-1", "0", "x", "9" * 30])
    elif how == 5:
        msg.headers.insert(1, ["Subject", "folded\r\n continuation\r\n\tand more"])
    elif how == 6:
        msg.headers[rng.randrange(len(msg.headers))][1] += "\x00\udcff\udc80"
    else:
        msg.headers.append(["Require", rng.choice(["100rel", "timer, foo", ""])])
    return msg.bytes()


def _bad_start_line(rng, host, port):
    msg = _options(rng, host, port)
    msg.start = rng.choice([
        f"OPTIONS sip:wave@{host} SIP/3.0", "OPTIONS SIP/2.0", "options sip:wave@x SIP/2.0",
        "OPTIONS  sip:wave@x  SIP/2.0", "SIP/2.0 999 Whatever", "SIP/2.0 200",
        "REGISTER sip:x SIP/2.0", "FROBNICATE sip:x SIP/2.0", "INVITE sip:x SIP/2.0 extra",
        "\x00INVITE sip:x SIP/2.0", "HTTP/1.1 200 OK"])
    return msg.bytes()


def _stray_response(rng, host, port):
    msg = _options(rng, host, port)
    msg.start = f"SIP/2.0 {rng.choice([100, 180, 200, 401, 487, 503])} Stray"
    return msg.bytes()


def _text(rng, host, port):
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789:;<>@ =/\r\n\t"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 800))).encode()


def _bytes(rng, host, port):
    return rng.randbytes(rng.choice([0, 1, 3, 12, 100, 1400, 9000]))


MUTATORS = {"truncated": _truncated, "huge_header": _huge_header,
            "bad_content_length": _bad_content_length, "bad_sdp": _bad_sdp,
            "no_dialog": _no_dialog, "bad_header": _bad_header,
            "bad_start_line": _bad_start_line, "stray_response": _stray_response,
            "text": _text, "bytes": _bytes}


# ----------------------------------------------------------------------------- RTP garbage

def rtp_garbage(rng: random.Random) -> tuple[str, bytes]:
    hdr = lambda b0, b1: struct.pack("!BBHII", b0, b1, rng.getrandbits(16),  # noqa: E731
                                     rng.getrandbits(32), rng.getrandbits(32))
    choice = rng.randrange(9)
    if choice == 0:
        return "rtp_bytes", rng.randbytes(rng.randrange(0, 200))
    if choice == 1:
        return "rtp_version", hdr(rng.choice([0x00, 0x40, 0xC0]), 0) + rng.randbytes(160)
    if choice == 2:
        return "rtp_csrc", hdr(0x8F, 0) + rng.randbytes(rng.randrange(0, 59))
    if choice == 3:
        return "rtp_extension", hdr(0x90, 0) + struct.pack("!HH", 0xBEDE, 0xFFFF) + bytes(8)
    if choice == 4:
        return "rtp_padding", hdr(0xA0, 0) + bytes(20) + bytes([rng.choice([0, 200, 255])])
    if choice == 5:
        return "rtcp_lookalike", bytes([0x80, rng.randrange(200, 205)]) + rng.randbytes(
            rng.randrange(0, 30))
    if choice == 6:
        return "rtp_oversize", hdr(0x80, 0) + rng.randbytes(1600)
    if choice == 7:
        return "rtp_empty", hdr(0x80, 0)
    return "rtp_valid", hdr(0x80, rng.randrange(128)) + rng.randbytes(160)


def plan(count: int, seed: int, host: str, sip_port: int) -> list[Datagram]:
    rng = random.Random(seed)
    kinds = sorted(MUTATORS)
    out = []
    for i in range(count):
        kind = rng.choice(kinds)
        out.append(Datagram(kind, rng.randrange(SOCKS), MUTATORS[kind](rng, host, sip_port)))
        if i % RTP_EVERY == RTP_EVERY - 1:
            kind, data = rtp_garbage(rng)
            out.append(Datagram(kind, rng.randrange(SOCKS), data, rtp=True))
    return out


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
