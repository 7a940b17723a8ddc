"""RFC 4733 telephone events (DTMF keys) in the caller's RTP: the payload, and the receiver that
turns the packets of one key press into one report.

A payload is one or more 4-byte event reports (§2.3):

    0                   1                   2                   3
    |     event     |E|R| volume    |          duration             |

event: 0-9, 10 = *, 11 = #, 12-15 = A-D (§3.2); E: the event has ended; R: reserved (ignored);
volume: power level, 0 to -63 dBm0, as its magnitude; duration: how long the event has lasted so
far, in timestamp units from the packet's RTP timestamp, which is the event's start (§2.5.1.2).

A sender reports one key in many packets: the same timestamp throughout, the duration growing,
the final packet (E set) usually sent three times (§2.5.1.4), every packet with a sequence
number of its own in the audio stream's sequence space. So a key press is identified by
(SSRC, timestamp) and reported once, on the first packet of it that says the key has been down
for some time (a duration above zero: some senders open an event with a zero-duration packet,
which reports nothing yet). Reporting it near its start, not at its end, gives whoever listens
the key as soon as the caller presses it; the updates, the repeated end packets (under new
sequence numbers, or, from older senders, under the same one) and any that arrive late report
nothing more.

Also handled: several events packed into one packet (§2.5.1.5: each starts where the one before
it ended), a key held past 0xFFFF timestamp units (§2.5.1.3: it continues as a new segment that
starts where the last ended, not a new press), and packets arriving out of order (a window of
recent presses is remembered, so a late update of an older key is not a new one).

Every report becomes a line in the bridge's event log, and a sender picks its timestamps: so
reports are bounded to `MAX_KEYS_PER_S` (a person keys about 10 a second, DTMF dialers at most
12), and presses beyond that are counted as `suppressed`, not reported.
"""
from __future__ import annotations

import collections
import re
from dataclasses import asdict, dataclass

from transports.sip.media.rtp import RtpPacket

DIGITS = "0123456789*#ABCD"           # events 0-15: the keys we announce in fmtp (0-15)
MAX_DURATION = 0xFFFF                 # a longer event continues in a new segment
HISTORY = 32                          # recent presses remembered against reordering
MAX_KEYS_PER_S = 20                   # reports a second at most, and as many in a burst
INFO_TYPES = ("application/dtmf-relay", "application/dtmf")    # SIP INFO bodies with a key
_SIGNAL = re.compile(r"^[ \t]*signal[ \t]*=[ \t]*(\S*)[ \t\r]*$", re.I | re.M)


class DtmfError(ValueError):
    """A telephone-event payload that is not whole 4-byte reports."""


@dataclass(frozen=True)
class EventReport:
    event: int
    end: bool
    volume: int                       # -dBm0
    duration: int                     # timestamp units


@dataclass(frozen=True)
class Key:
    """One key press, reported once."""
    digit: str
    event: int
    timestamp: int                    # RTP timestamp of the press: its identity in the stream
    ssrc: int
    volume: int
    duration: int                     # timestamp units seen by the time it was reported
    end: bool                         # the reporting packet already said it ended


def info_digit(content_type: str, body: bytes) -> str:
    """The key of a SIP INFO body: `application/dtmf-relay`'s `Signal=` line or
    `application/dtmf`'s whole body, a key (0-9 * # A-D) or its event number (0-15); raises
    DtmfError when it names none."""
    text = body.decode("ascii", "replace")
    if content_type == "application/dtmf-relay":
        found = _SIGNAL.search(text)
        signal = found.group(1) if found else ""
    else:
        signal = text.strip()
    if signal.isdigit() and len(signal) <= 2 and int(signal) < len(DIGITS):
        return DIGITS[int(signal)]
    if len(signal) == 1 and signal.upper() in DIGITS:
        return signal.upper()
    raise DtmfError(f"no key in the {content_type} body: {signal[:16]!r}")


def parse(payload: bytes) -> list[EventReport]:
    if not payload or len(payload) % 4:
        raise DtmfError(f"telephone-event payload of {len(payload)} bytes is not 4-byte reports")
    return [EventReport(payload[i], bool(payload[i + 1] & 0x80), payload[i + 1] & 0x3F,
                        int.from_bytes(payload[i + 2:i + 4], "big"))
            for i in range(0, len(payload), 4)]


def pack(report: EventReport) -> bytes:
    if not 0 <= report.event <= 255 or not 0 <= report.volume <= 63 \
            or not 0 <= report.duration <= MAX_DURATION:
        raise ValueError("event 0..255, volume 0..63, duration 0..65535")
    return bytes([report.event, (0x80 if report.end else 0) | report.volume]) + \
        report.duration.to_bytes(2, "big")


@dataclass
class _Press:
    event: int
    duration: int = 0
    ended: bool = False
    reported: bool = False


@dataclass
class DtmfStats:
    packets: int = 0                  # telephone-event packets parsed
    keys: int = 0                     # key presses reported
    other_events: int = 0             # reports of events that are not keys 0-15: ignored
    suppressed: int = 0               # presses beyond MAX_KEYS_PER_S: not reported

    def as_dict(self) -> dict:
        return asdict(self)


class DtmfReceiver:
    """Invariant: each (SSRC, timestamp) of a key is reported at most once while it is among the
    last `HISTORY` presses; a long key's later segments are never reported."""

    def __init__(self, history: int = HISTORY, max_per_s: float = MAX_KEYS_PER_S):
        self.stats = DtmfStats()
        self._presses: collections.OrderedDict[tuple[int, int], _Press] = \
            collections.OrderedDict()
        self._history, self._rate = history, max_per_s
        self._tokens, self._refilled = max_per_s, None

    def push(self, pkt: RtpPacket, now: float) -> list[Key]:
        """The key presses that `pkt` (a telephone-event packet, arrived at `now`, seconds)
        reports for the first time; raises DtmfError for a broken payload."""
        reports = parse(pkt.payload)
        self.stats.packets += 1
        keys, start = [], pkt.timestamp
        for report in reports:
            key = self._report(pkt.ssrc, start, report)
            if key is not None and self._allowed(now):
                self.stats.keys += 1
                keys.append(key)
            elif key is not None:
                self.stats.suppressed += 1
            start = (start + report.duration) & 0xFFFFFFFF
        return keys

    def press(self, now: float) -> bool:
        """A key reported outside the RTP (a SIP INFO): counted, and whether it is within the
        rate bound this receiver keeps for the call."""
        if self._allowed(now):
            self.stats.keys += 1
            return True
        self.stats.suppressed += 1
        return False

    def _allowed(self, now: float) -> bool:
        if self._refilled is not None:
            self._tokens = min(self._rate, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def _report(self, ssrc: int, timestamp: int, report: EventReport) -> Key | None:
        if report.event >= len(DIGITS):
            self.stats.other_events += 1
            return None
        press = self._presses.get((ssrc, timestamp))
        if press is None:
            continued = self._continues(ssrc, timestamp, report.event)
            press = self._remember((ssrc, timestamp), report.event)
            press.reported = continued
        press.duration = max(press.duration, report.duration)
        press.ended = press.ended or report.end
        if press.reported or report.duration == 0:
            return None
        press.reported = True
        return Key(DIGITS[report.event], report.event, timestamp, ssrc, report.volume,
                   report.duration, report.end)

    def _remember(self, key: tuple[int, int], event: int) -> _Press:
        press = self._presses[key] = _Press(event)
        while len(self._presses) > self._history:
            self._presses.popitem(last=False)
        return press

    def _continues(self, ssrc: int, timestamp: int, event: int) -> bool:
        """A new segment of a key held past the longest duration, not a new press."""
        for (s, ts), press in self._presses.items():
            if s == ssrc and press.event == event and press.reported and \
                    (not press.ended or press.duration == MAX_DURATION) and \
                    (ts + press.duration) & 0xFFFFFFFF == timestamp:
                return True
        return False
