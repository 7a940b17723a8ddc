"""SIP messages (RFC 3261 §7, §20, §25): parse one UDP datagram, serialise, build responses.

A message is a start line, an ordered list of (canonical name, value) headers and a body. Header
names are case-insensitive and have compact forms (`i` = Call-ID ...); both are canonicalised on
parse so that `get("call-id")` and `get("i")` agree. Folded header lines are unfolded. Bytes are
decoded as UTF-8 with `surrogateescape`, so a message serialises back to the bytes it came from
and invalid UTF-8 is detected, not fatal. `parse` raises `SipParseError` carrying the partial
message (start line and every header that parsed) so that the server can still answer 400 when
it has enough to address a response; garbage without a start line has `partial=None`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_MESSAGE = 65_535              # one UDP datagram
MAX_HEADERS = 128
SIP_VERSION = "SIP/2.0"

TOKEN = r"[A-Za-z0-9\-.!%*_+`'~]+"
_REQUEST_LINE = re.compile(rf"({TOKEN}) ([A-Za-z][A-Za-z0-9+.\-]*:\S+) (SIP/\d+\.\d+)")
_STATUS_LINE = re.compile(r"(SIP/\d+\.\d+) ([1-6]\d\d) ([^\r\n]*)")
_HEADER_NAME = re.compile(TOKEN)
_CSEQ = re.compile(rf"(\d{{1,10}})\s+({TOKEN})")

COMPACT = {"i": "Call-ID", "m": "Contact", "e": "Content-Encoding", "l": "Content-Length",
           "c": "Content-Type", "f": "From", "s": "Subject", "k": "Supported", "t": "To",
           "v": "Via", "o": "Event", "u": "Allow-Events", "x": "Session-Expires",
           "r": "Refer-To", "b": "Referred-By", "a": "Accept-Contact", "j": "Reject-Contact",
           "d": "Request-Disposition", "y": "Identity", "n": "Identity-Info"}
_KNOWN = ("Accept", "Accept-Encoding", "Accept-Language", "Alert-Info", "Allow",
          "Authentication-Info", "Authorization", "Call-ID", "Call-Info", "Contact",
          "Content-Disposition", "Content-Encoding", "Content-Language", "Content-Length",
          "Content-Type", "CSeq", "Date", "Error-Info", "Expires", "From", "In-Reply-To",
          "Max-Forwards", "MIME-Version", "Min-Expires", "Organization", "Priority",
          "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Require", "Record-Route",
          "Reply-To", "Require", "Retry-After", "Route", "Server", "Subject", "Supported",
          "Timestamp", "To", "Unsupported", "User-Agent", "Via", "Warning", "WWW-Authenticate",
          "RSeq", "RAck", "Session-Expires", "Min-SE", "Event", "Allow-Events", "Refer-To",
          "Referred-By")
_CANONICAL = {name.lower(): name for name in _KNOWN}
SINGLE = ("Call-ID", "CSeq", "From", "To", "Content-Length", "Max-Forwards", "Content-Type")

REASONS = {100: "Trying", 180: "Ringing", 183: "Session Progress", 200: "OK",
           400: "Bad Request", 405: "Method Not Allowed", 408: "Request Timeout",
           415: "Unsupported Media Type", 420: "Bad Extension",
           481: "Call/Transaction Does Not Exist", 482: "Loop Detected", 486: "Busy Here",
           487: "Request Terminated", 488: "Not Acceptable Here", 491: "Request Pending",
           500: "Server Internal Error", 501: "Not Implemented", 503: "Service Unavailable",
           505: "Version Not Supported", 513: "Message Too Large"}


def canonical(name: str) -> str:
    """The canonical spelling of a header name (compact forms expanded)."""
    lower = name.lower()
    if lower in COMPACT:
        return COMPACT[lower]
    return _CANONICAL.get(lower, name)


class SipParseError(ValueError):
    """A datagram that is not a valid SIP message; `partial` is what parsed (None if nothing)."""

    def __init__(self, reason: str, partial: "SipMessage | None" = None):
        super().__init__(reason)
        self.reason, self.partial = reason, partial


@dataclass
class SipMessage:
    """A request (`method`, `uri`) or a response (`status`, `reason`)."""
    method: str | None = None
    uri: str | None = None
    status: int | None = None
    reason: str = ""
    version: str = SIP_VERSION
    headers: list[tuple[str, str]] = field(default_factory=list)   # (canonical name, value)
    body: bytes = b""

    @property
    def is_request(self) -> bool:
        return self.method is not None

    def get(self, name: str, default: str | None = None) -> str | None:
        name = canonical(name)
        for key, value in self.headers:
            if key == name:
                return value
        return default

    def get_all(self, name: str) -> list[str]:
        name = canonical(name)
        return [value for key, value in self.headers if key == name]

    def count(self, name: str) -> int:
        return len(self.get_all(name))

    def add(self, name: str, value: str) -> None:
        self.headers.append((canonical(name), value))

    def set(self, name: str, value: str) -> None:
        """Replace every header of `name` by one, in the place of the first (else at the end)."""
        name = canonical(name)
        out, placed = [], False
        for key, old in self.headers:
            if key != name:
                out.append((key, old))
            elif not placed:
                out.append((key, value))
                placed = True
        if not placed:
            out.append((name, value))
        self.headers = out

    def start_line(self) -> str:
        if self.is_request:
            return f"{self.method} {self.uri} {self.version}"
        return f"{self.version} {self.status} {self.reason}"

    def to_bytes(self) -> bytes:
        """Serialise; Content-Length is always written and always equals len(body)."""
        msg = SipMessage(self.method, self.uri, self.status, self.reason, self.version,
                         list(self.headers), self.body)
        msg.set("Content-Length", str(len(self.body)))
        lines = [msg.start_line()] + [f"{k}: {v}" for k, v in msg.headers]
        head = "\r\n".join(lines) + "\r\n\r\n"
        return head.encode("utf-8", "surrogateescape") + self.body


def parse(data: bytes) -> SipMessage:
    """One SIP message from one datagram (RFC 3261 §7, §18.3)."""
    if len(data) > MAX_MESSAGE:
        raise SipParseError(f"message of {len(data)} bytes is too large")
    data = data.lstrip(b"\r\n")                           # CRLF keep-alives before a message
    end = data.find(b"\r\n\r\n")
    sep = 4
    if end < 0:
        end, sep = data.find(b"\n\n"), 2            # tolerate bare LF line ends
    if end < 0:
        head, body, terminated = data, b"", False
    else:
        head, body, terminated = data[:end], data[end + sep:], True
    text = head.decode("utf-8", "surrogateescape")
    lines = text.replace("\r\n", "\n").split("\n")
    msg = _start_line(lines[0])
    error = _headers(msg, lines[1:])
    if error is None and not terminated:
        error = "headers are not terminated by an empty line"
    if error is None and any("\udc80" <= c <= "\udcff" for c in text):
        error = "message head is not valid UTF-8"
    if error is None:
        error = _body(msg, body)
    if error is not None:
        raise SipParseError(error, msg)
    return msg


def _start_line(line: str) -> SipMessage:
    if m := _REQUEST_LINE.fullmatch(line):
        return SipMessage(method=m.group(1), uri=m.group(2), version=m.group(3))
    if m := _STATUS_LINE.fullmatch(line):
        return SipMessage(status=int(m.group(2)), reason=m.group(3), version=m.group(1))
    raise SipParseError(f"not a SIP start line: {line[:60]!r}")


def _headers(msg: SipMessage, lines: list[str]) -> str | None:
    """Fill msg.headers; return the first error (every header that parses is kept)."""
    error = None
    for line in lines:
        if line[:1] in (" ", "\t") and msg.headers:          # folded continuation (LWS)
            name, value = msg.headers[-1]
            msg.headers[-1] = (name, f"{value} {line.strip()}".strip())
            continue
        name, colon, value = line.partition(":")
        name = name.rstrip(" \t")
        if not colon or not _HEADER_NAME.fullmatch(name):
            error = error or f"malformed header line {line[:60]!r}"
            continue
        if len(msg.headers) >= MAX_HEADERS:
            return f"more than {MAX_HEADERS} headers"
        msg.headers.append((canonical(name), value.strip(" \t")))
    return error


def _body(msg: SipMessage, body: bytes) -> str | None:
    lengths = msg.get_all("Content-Length")
    if not lengths:
        msg.body = body                                     # UDP: the rest of the datagram
        return None
    if len(lengths) > 1 or not lengths[0].isdigit():
        return f"bad Content-Length {lengths[0]!r}"
    n = int(lengths[0])
    if n > len(body):
        return f"Content-Length {n} exceeds the {len(body)} body bytes received"
    msg.body = body[:n]                                     # extra bytes are discarded (§18.3)
    return None


def check_request(msg: SipMessage) -> str | None:
    """Why a parsed request is not acceptable (the reason of a 400), or None."""
    for name in ("Via", "From", "To", "Call-ID", "CSeq"):
        if not msg.get(name):
            return f"missing {name}"
    for name in SINGLE:
        if msg.count(name) > 1:
            return f"more than one {name}"
    try:
        number, method = parse_cseq(msg.get("CSeq"))
        parse_via(split_commas(msg.get("Via"))[0])
        parse_name_addr(msg.get("From"))
        parse_name_addr(msg.get("To"))
    except ValueError as exc:
        return str(exc)
    if method != msg.method:
        return f"CSeq method {method} does not match {msg.method}"
    mf = msg.get("Max-Forwards")
    if mf is not None and not (mf.isdigit() and int(mf) <= 255):
        return f"bad Max-Forwards {mf!r}"
    return None


def bad_contact(value: str | None) -> str | None:
    """Why an INVITE's Contact cannot be the dialog's remote target (RFC 3261 §8.1.1.8), or
    None."""
    if not value:
        return "missing Contact"
    try:
        parse_name_addr(value)
    except ValueError as exc:
        return f"bad Contact: {exc}"
    return None


# ---------------------------------------------------------------------------- header values


def split_commas(value: str) -> list[str]:
    """Split a header value on commas outside quotes and <> (RFC 3261 §7.3.1)."""
    parts, depth, quoted, start, i = [], 0, False, 0, 0
    while i < len(value):
        c = value[i]
        if quoted and c == "\\":
            i += 1
        elif c == '"':
            quoted = not quoted
        elif not quoted and c == "<":
            depth += 1
        elif not quoted and c == ">":
            depth = max(0, depth - 1)
        elif not quoted and depth == 0 and c == ",":
            parts.append(value[start:i].strip())
            start = i + 1
        i += 1
    parts.append(value[start:].strip())
    return [p for p in parts if p]


def parse_params(text: str) -> dict[str, str | None]:
    """`;a=b;c` -> {"a": "b", "c": None}; names lower-cased."""
    params: dict[str, str | None] = {}
    for item in text.split(";"):
        item = item.strip()
        if not item:
            continue
        key, eq, val = item.partition("=")
        params[key.strip().lower()] = val.strip().strip('"') if eq else None
    return params


@dataclass(frozen=True)
class NameAddr:
    display: str
    uri: str
    params: dict

    @property
    def tag(self) -> str | None:
        return self.params.get("tag")


def parse_name_addr(value: str) -> NameAddr:
    """From/To/Contact/Route: `"Name" <uri>;params`, or `uri;params` (then the params are the
    header's, not the URI's)."""
    value = value.strip()
    if "<" in value:
        display, _, rest = value.partition("<")
        uri, close, params = rest.partition(">")
        if not close or not uri.strip():
            raise ValueError(f"bad address {value[:60]!r}")
        return NameAddr(display.strip().strip('"'), uri.strip(), parse_params(params))
    uri, _, params = value.partition(";")
    if ":" not in uri or " " in uri.strip():
        raise ValueError(f"bad address {value[:60]!r}")
    return NameAddr("", uri.strip(), parse_params(params))


@dataclass(frozen=True)
class Via:
    transport: str
    host: str
    port: int | None
    params: dict


def parse_via(value: str) -> Via:
    proto, _, rest = value.strip().partition(" ")
    parts = proto.split("/")
    if len(parts) != 3 or parts[0].upper() != "SIP" or not rest.strip():
        raise ValueError(f"bad Via {value[:60]!r}")
    sent_by, _, params = rest.strip().partition(";")
    host, port = split_hostport(sent_by.strip())
    return Via(parts[2].upper(), host, port, parse_params(params))


def split_hostport(text: str) -> tuple[str, int | None]:
    if text.startswith("["):                                   # IPv6 reference
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = text.partition(":")
    if not host or (port and not (port.isdigit() and 0 < int(port) < 65536)):
        raise ValueError(f"bad host:port {text[:60]!r}")
    return host, int(port) if port else None


def parse_cseq(value: str | None) -> tuple[int, str]:
    m = _CSEQ.fullmatch((value or "").strip())
    if not m or int(m.group(1)) >= 2 ** 31:
        raise ValueError(f"bad CSeq {value!r}")
    return int(m.group(1)), m.group(2)


@dataclass(frozen=True)
class SipUri:
    scheme: str
    user: str
    host: str
    port: int | None
    params: dict


def parse_uri(uri: str) -> SipUri:
    scheme, colon, rest = uri.partition(":")
    if not colon or scheme.lower() not in ("sip", "sips"):
        raise ValueError(f"not a SIP URI {uri[:60]!r}")
    rest = rest.split("?", 1)[0]
    hostpart, _, params = rest.partition(";")
    user, at, hostport = hostpart.rpartition("@")
    host, port = split_hostport(hostport)
    return SipUri(scheme.lower(), user if at else "", host, port, parse_params(params))


# ---------------------------------------------------------------------------- responses


def make_response(req: SipMessage, status: int, reason: str | None = None, *,
                  to_tag: str | None = None, source: tuple[str, int] | None = None,
                  headers: list[tuple[str, str]] = (), body: bytes = b"") -> SipMessage:
    """A response to `req` (RFC 3261 §8.2.6): Via, From, To, Call-ID and CSeq copied, a To tag
    added where the request had none, `received`/`rport` on the top Via (RFC 3581)."""
    resp = SipMessage(status=status, reason=reason or REASONS.get(status, "Unknown"))
    vias = req.get_all("Via")
    for i, via in enumerate(vias):
        resp.add("Via", _stamp_via(via, source) if i == 0 and source else via)
    for name in ("From", "To", "Call-ID", "CSeq"):
        value = req.get(name)
        if value is None:
            continue
        if name == "To" and to_tag and status > 100 and not _has_tag(value):
            value = f"{value};tag={to_tag}"
        resp.add(name, value)
    for name, value in headers:
        resp.add(name, value)
    resp.body = body
    return resp


def _has_tag(value: str) -> bool:
    try:
        return parse_name_addr(value).tag is not None
    except ValueError:
        return False


def _stamp_via(via: str, source: tuple[str, int]) -> str:
    first, *rest = split_commas(via)
    try:
        parsed = parse_via(first)
    except ValueError:
        return via
    ip, port = source
    if parsed.host != ip and "received" not in parsed.params:
        first += f";received={ip}"
    if "rport" in parsed.params and parsed.params["rport"] is None:
        first = re.sub(r";\s*rport(?=;|$)", f";rport={port}", first, count=1)
    return ", ".join([first, *rest])
