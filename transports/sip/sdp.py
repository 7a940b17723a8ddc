"""SDP (RFC 4566) parse/serialise and the offer/answer of one audio stream (RFC 3264).

We speak G.711 only: PCMU (static payload type 0) and PCMA (8), 8 kHz, one channel, 20 ms
packets. `negotiate` picks the first offered codec we support (the offerer's preference order,
RFC 3264 §6.1), answers every other m= line with port 0 (rejected, same count and order), mirrors
the direction attribute and raises `NotAcceptable` (-> 488) when no audio stream can be used.
A description that is not valid SDP raises `SdpError` (-> 400).

DTMF keys (RFC 4733): when the chosen stream offers `telephone-event` at the codec's clock rate,
the answer lists it too, under the offerer's payload type (RFC 3264 §6.1: the answer uses the
offer's numbers), with `a=fmtp:<pt> 0-15`: the events we receive are the 16 keys. An offer
without it gets an answer without it. Our own offer carries it under `EVENT_PT`.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace

MAX_SDP = 16 * 1024
DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
_MIRROR = {"sendrecv": "sendrecv", "sendonly": "recvonly", "recvonly": "sendonly",
           "inactive": "inactive"}
RTP_PROFILES = ("RTP/AVP", "RTP/AVPF")          # plain RTP; SRTP (RTP/SAVP...) is refused


class SdpError(ValueError):
    """Not a valid session description."""


class NotAcceptable(ValueError):
    """Valid SDP that offers nothing we can use."""


@dataclass(frozen=True)
class Codec:
    name: str            # encoding name as in rtpmap, upper case
    pt: int              # static payload type (RFC 3551)
    rate: int
    law: str             # wire format name of the node protocol

    @property
    def silence(self) -> int:
        """The byte of digital silence in this law."""
        return 0xFF if self.law == "pcmu" else 0xD5


PCMU = Codec("PCMU", 0, 8000, "pcmu")
PCMA = Codec("PCMA", 8, 8000, "pcma")
CODECS = {c.name: c for c in (PCMU, PCMA)}
TELEPHONE_EVENT = "TELEPHONE-EVENT"
EVENT_PT = 101                    # the dynamic payload type our own offer gives telephone-event
EVENTS = "0-15"                   # the events we receive: the keys 0-9 * # A-D


@dataclass
class Media:
    media: str                       # "audio", "video" ...
    port: int
    proto: str
    formats: list[str]
    lines: list[tuple[str, str]] = field(default_factory=list)   # i/c/b/k/a lines, in order

    def attrs(self, name: str) -> list[str | None]:
        """Values of every `a=name[:value]` line (None for a flag)."""
        out = []
        for key, value in self.lines:
            if key == "a":
                attr, colon, val = value.partition(":")
                if attr == name:
                    out.append(val if colon else None)
        return out

    @property
    def connection(self) -> str | None:
        return next((v for k, v in self.lines if k == "c"), None)


@dataclass
class Session:
    lines: list[tuple[str, str]]                 # session-level lines, v= first
    media: list[Media] = field(default_factory=list)

    def get(self, key: str) -> str | None:
        return next((v for k, v in self.lines if k == key), None)

    def to_bytes(self) -> bytes:
        out = [f"{k}={v}" for k, v in self.lines]
        for m in self.media:
            out.append(f"m={m.media} {m.port} {m.proto} {' '.join(m.formats)}")
            out += [f"{k}={v}" for k, v in m.lines]
        return ("\r\n".join(out) + "\r\n").encode()


def parse(data: bytes) -> Session:
    if len(data) > MAX_SDP:
        raise SdpError("SDP too large")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SdpError("SDP is not UTF-8") from None
    lines = [ln for ln in text.replace("\r\n", "\n").split("\n") if ln.strip()]
    if not lines or lines[0].strip() != "v=0":
        raise SdpError("SDP must start with v=0")
    session = Session([])
    for line in lines:
        key, eq, value = line.partition("=")
        if not eq or len(key) != 1 or not key.isalpha() or not key.islower():
            raise SdpError(f"bad SDP line {line[:60]!r}")
        if key == "m":
            session.media.append(_media_line(value))
        elif session.media:
            session.media[-1].lines.append((key, value))
        else:
            session.lines.append((key, value))
    for key in "ost":
        if session.get(key) is None:
            raise SdpError(f"SDP lacks its {key}= line")
    for c in [session.get("c")] + [m.connection for m in session.media]:
        if c is not None:
            connection_address(c)
    return session


def _media_line(value: str) -> Media:
    parts = value.split()
    if len(parts) < 4:
        raise SdpError(f"bad m= line {value[:60]!r}")
    port = parts[1].split("/")[0]
    if not port.isdigit() or int(port) > 65535:
        raise SdpError(f"bad m= port {parts[1]!r}")
    return Media(parts[0], int(port), parts[2], parts[3:])


def connection_address(value: str) -> str:
    """`IN IP4 1.2.3.4[/ttl]` -> "1.2.3.4"."""
    parts = value.split()
    if len(parts) != 3 or parts[0] != "IN" or parts[1] not in ("IP4", "IP6"):
        raise SdpError(f"bad c= line {value[:60]!r}")
    address = parts[2].split("/")[0]
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise SdpError(f"c= address is not an IP literal: {address[:60]!r}") from None
    return address


def _rtpmaps(media: Media) -> dict[str, str]:
    """Payload type -> encoding (`NAME/rate[/channels]`, the name upper case)."""
    rtpmap = {}
    for value in media.attrs("rtpmap"):
        pt, _, enc = (value or "").strip().partition(" ")
        rtpmap[pt] = enc.strip().upper()
    return rtpmap


def offered_codec(media: Media) -> Codec | None:
    """The first format of `media` that is a codec we speak, in the offer's order."""
    rtpmap = _rtpmaps(media)
    for fmt in media.formats:
        if not fmt.isdigit() or int(fmt) > 127:
            continue
        enc = rtpmap.get(fmt)
        if enc is None:                             # static payload types need no rtpmap
            codec = next((c for c in CODECS.values() if c.pt == int(fmt)), None)
        else:
            name, rate, channels = (enc.split("/") + ["", ""])[:3]
            ok = rate == "8000" and channels in ("", "1")
            codec = replace(CODECS[name], pt=int(fmt)) if ok and name in CODECS else None
        if codec is not None:
            return codec
    return None


def offered_events(media: Media, codec: Codec) -> int | None:
    """The payload type `media` gives telephone-event at `codec`'s clock rate (None: none)."""
    rtpmap = _rtpmaps(media)
    for fmt in media.formats:
        if not fmt.isdigit() or int(fmt) > 127 or int(fmt) == codec.pt:
            continue
        name, rate, channels = (rtpmap.get(fmt, "").split("/") + ["", ""])[:3]
        if name == TELEPHONE_EVENT and rate == str(codec.rate) and channels in ("", "1"):
            return int(fmt)
    return None


def _event_lines(pt: int, rate: int) -> list[tuple[str, str]]:
    return [("a", f"rtpmap:{pt} telephone-event/{rate}"), ("a", f"fmtp:{pt} {EVENTS}")]


@dataclass(frozen=True)
class Answer:
    codec: Codec
    remote: tuple[str, int] | None      # where to send RTP; None when on hold (0.0.0.0)
    direction: str                      # our direction, from the answer
    remote_ptime_ms: int | None
    sdp: Session
    event_pt: int | None = None         # telephone-event's payload type; None: not agreed

    @property
    def we_send(self) -> bool:
        return self.remote is not None and self.direction in ("sendrecv", "sendonly")

    @property
    def peer_sends(self) -> bool:
        return self.direction in ("sendrecv", "recvonly")


def negotiate(offer: Session, local_ip: str, local_port: int, session_id: int,
              version: int, ptime_ms: int = 20, events: bool = True) -> Answer:
    """Answer `offer` with one G.711 audio stream on local_ip:local_port (and telephone-event
    when `events` and the offer has it)."""
    chosen, answer_media = None, []
    for m in offer.media:
        codec = None
        if chosen is None and m.media == "audio" and m.port != 0 and m.proto in RTP_PROFILES:
            codec = offered_codec(m)
        if codec is None:
            answer_media.append(Media(m.media, 0, m.proto, m.formats[:1]))
            continue
        event_pt = offered_events(m, codec) if events else None
        chosen = (m, codec, event_pt)
        direction = next((a for a in DIRECTIONS if m.attrs(a)), None) or \
            next((a for a in DIRECTIONS if _session_attr(offer, a)), "sendrecv")
        ours = _MIRROR[direction]
        formats = [str(codec.pt)] + ([] if event_pt is None else [str(event_pt)])
        answer_media.append(Media("audio", local_port, m.proto, formats, [
            ("a", f"rtpmap:{codec.pt} {codec.name}/{codec.rate}"),
            *([] if event_pt is None else _event_lines(event_pt, codec.rate)),
            ("a", f"ptime:{ptime_ms}"), ("a", ours)]))
    if chosen is None:
        raise NotAcceptable("no audio stream offers PCMU/8000 or PCMA/8000 over RTP/AVP")
    media, codec, event_pt = chosen
    conn = media.connection or offer.get("c")
    if conn is None:
        raise SdpError("the audio stream has no c= address")
    address = connection_address(conn)
    remote = None if ipaddress.ip_address(address).is_unspecified else (address, media.port)
    ptimes = [p for p in media.attrs("ptime") if p and p.strip().isdigit()]
    family = "IP6" if ":" in local_ip else "IP4"
    sdp = Session([("v", "0"), ("o", f"wave {session_id} {version} IN {family} {local_ip}"),
                   ("s", "wave"), ("c", f"IN {family} {local_ip}"), ("t", "0 0")],
                  answer_media)
    return Answer(codec, remote, _MIRROR[direction], int(ptimes[0]) if ptimes else None, sdp,
                  event_pt)


def _session_attr(session: Session, name: str) -> bool:
    return any(k == "a" and v.partition(":")[0] == name for k, v in session.lines)


def offer(local_ip: str, local_port: int, session_id: int, version: int = 1,
          ptime_ms: int = 20, codecs: tuple[Codec, ...] = (PCMU, PCMA),
          events: bool = True) -> Session:
    """Our own offer (for an INVITE that came without SDP); telephone-event under EVENT_PT."""
    family = "IP6" if ":" in local_ip else "IP4"
    rtpmaps = [("a", f"rtpmap:{c.pt} {c.name}/{c.rate}") for c in codecs]
    formats = [str(c.pt) for c in codecs]
    if events:
        rtpmaps += _event_lines(EVENT_PT, codecs[0].rate)
        formats.append(str(EVENT_PT))
    return Session([("v", "0"), ("o", f"wave {session_id} {version} IN {family} {local_ip}"),
                    ("s", "wave"), ("c", f"IN {family} {local_ip}"), ("t", "0 0")],
                   [Media("audio", local_port, "RTP/AVP", formats,
                          [*rtpmaps, ("a", f"ptime:{ptime_ms}"), ("a", "sendrecv")])])
