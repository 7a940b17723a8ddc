"""What the SIP fuzzer sends (`chaos/sip_fuzz.py` sends it): a pure function of its arguments.

`plan(count, seed, host, sip_port)` gives `count` SIP datagrams, each built by one mutator of
MUTATORS chosen by `random.Random(seed)`, and after every RTP_EVERY-th one an RTP datagram
(`rtp_garbage`), each from one of SOCKS source ports. Via and Contact name a fixed
`fuzz.invalid` host, since the bridge answers the source address.
"""
from __future__ import annotations

import random
import struct
from dataclasses import dataclass

SOCKS = 3
RTP_EVERY = 4                # one RTP datagram after every 4th SIP one
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
