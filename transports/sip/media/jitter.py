"""Adaptive jitter buffer for one inbound RTP stream.

The playout clock of the caller's audio is the node's beat, not ours: the node cuts 80 ms frames
and takes two per 160 ms beat, so audio that reaches it early is never harmful and audio held
here only adds latency. The buffer therefore releases packets *in sequence order as soon as they
are contiguous*, and holds packets only behind a gap, for an adaptive wait:

    wait = clamp(min_wait, max(4 * J, grown, reach + ptime), max_wait)

where J is the RFC 3550 interarrival jitter estimate, `grown` rises by half (plus one ptime)
every time a packet arrives after its gap was given up on (a late packet), then decays back
towards 4 * J over ~250 released packets, and `reach` is how long this path's packets trailed
their successors (the rule the node's reorder buffer learns a ZMQ connection by,
`wave_actors.core.reorder.Reach`): it starts at `start_wait`, rises to the longest trail seen
(a gap filled in time, or a packet that came after its gap was given up), and halves every
`reach_half_life` once the path stops reordering. A path that shuffles its packets within a
few packets' time is so heard whole from its first gap on, not after it lost some: the node's
jitter buffer plays a call's first frames from its prebuffer, so that first wait costs
nothing yet. When a gap's wait expires (or the buffer reaches its
capacity) the missing sequence numbers are declared lost and concealed with G.711 silence of the
exact length the RTP timestamps imply (for at most `max_conceal` packets of a gap), so the
node's input timeline stays continuous.

Telephone-event packets (RFC 4733 DTMF) share the audio stream's sequence numbers, and a phone
usually sends them instead of audio while a key is down: they are pushed as `events` (no audio,
no jitter sample: their timestamp stays at the key's start while they keep arriving) so that the
numbers they hold are neither waited for nor counted lost when the audio resumes. Senders repeat
an event's end packet on purpose, some under one sequence number: such a repeat is `repeated`,
not a network `duplicate`.

Invariant (checked by the tests): sequence numbers leave in strictly increasing, contiguous
order, each either `played` once (an event packet: counted in `events`, no payload) or `lost`;
every packet pushed is played once, or counted `late` / `duplicate` / `repeated` / `jumped`, or
is still buffered (`depth`). A far sequence jump or a new SSRC is believed only after two
consecutive packets (RFC 3550 A.1 probation): then the buffer resyncs.
"""
from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, replace

from transports.sip.media.rtp import RtpPacket
from wave_actors.core.reorder import Reach


@dataclass(frozen=True)
class JitterConfig:
    rate: int = 8000                 # RTP clock, Hz
    ptime: float = 0.020             # nominal packet duration, s
    min_wait: float = 0.040          # shortest hold behind a gap, s
    max_wait: float = 0.200          # longest hold (bounds the latency a gap can add), s
    capacity: int = 64               # packets held at most; a full buffer gives up its gap
    max_conceal: int = 8             # lost packets per gap filled with silence (160 ms)
    max_jump: int = 200              # a sequence step beyond this is a jump (probation)
    history: int = 256               # lost sequence numbers remembered to tell late from dup
    start_wait: float = 0.200        # the reach a call starts with (module doc), s
    reach_half_life: float = 20.0    # the reach halves in this long without reordering, s

    @property
    def samples_per_packet(self) -> int:
        return round(self.rate * self.ptime)


@dataclass
class JitterStats:
    received: int = 0                # packets pushed
    played: int = 0                  # released in order
    events: int = 0                  # telephone-event packets released in order (no audio)
    lost: int = 0                    # sequence numbers given up on
    concealed: int = 0               # lost packets replaced by silence
    reordered: int = 0               # arrived after a later packet, still in time: absorbed
    late: int = 0                    # arrived after being declared lost: dropped
    duplicate: int = 0               # arrived twice: dropped
    repeated: int = 0                # an event packet sent again under its number: dropped
    jumped: int = 0                  # far jump / foreign SSRC that did not resync: dropped
    resyncs: int = 0                 # sequence restarts or SSRC changes believed
    forced: int = 0                  # gaps given up early because the buffer was full
    max_depth: int = 0
    jitter_ms: float = 0.0           # RFC 3550 interarrival jitter
    wait_ms: float = 0.0             # current hold behind a gap

    def as_dict(self) -> dict:
        d = asdict(self)
        d["jitter_ms"], d["wait_ms"] = round(self.jitter_ms, 2), round(self.wait_ms, 2)
        return d


@dataclass(frozen=True)
class Out:
    """One sequence number leaving the buffer: its payload, or silence / None when lost."""
    seq: int                         # extended (no wrap) sequence number
    payload: bytes | None
    lost: bool = False


class JitterBuffer:
    def __init__(self, config: JitterConfig = JitterConfig(), silence: int = 0xFF):
        self.cfg, self.silence = config, silence
        self.stats = JitterStats(wait_ms=config.min_wait * 1000)
        self._buf: dict[int, tuple[RtpPacket, float]] = {}     # ext seq -> (packet, arrival)
        self._next: int | None = None        # ext seq of the next packet to release
        self._start = 0                      # ext seq of the stream's first packet
        self._max_ext = 0                    # highest ext seq accepted
        self._ssrc: int | None = None
        self._last: RtpPacket | None = None  # last released packet (for concealment sizes)
        self._lost = deque(maxlen=config.history)
        # lost ext seq -> when the packet after its gap arrived (how long a late one trailed)
        self._lost_at: dict[int, float] = {}
        self._probe: RtpPacket | None = None
        self._pending: list[Out] = []        # released by a resync, handed out by the next pop
        self._transit: float | None = None
        self._jitter = 0.0                   # seconds
        self._wait = config.min_wait
        self._reach = Reach(start_s=config.start_wait, max_s=config.max_wait,
                            margin_s=config.ptime, half_life_s=config.reach_half_life)
        self._now = 0.0                      # the latest time pushed or popped
        self.stats.wait_ms = 1000 * min(config.max_wait, max(config.min_wait,
                                                            config.start_wait + config.ptime))

    @property
    def depth(self) -> int:
        return len(self._buf)

    def push(self, pkt: RtpPacket, now: float, audio: bool = True) -> None:
        """Accept one packet that arrived at `now` (seconds, monotonic); `audio=False` for a
        telephone-event packet, which takes its sequence number and leaves without a payload."""
        self.stats.received += 1
        self._now = max(self._now, now)
        if not audio:
            pkt = replace(pkt, payload=b"")
        if self._next is None:
            self._restart(pkt)
        elif self._foreign(pkt):
            if not self._on_probation(pkt, now):
                return
        else:
            self._probe = None
        ext = self._extend(pkt.seq)
        if ext < self._next:
            if ext in self._lost_at or ext < self._start:       # its slot went by unplayed
                self.stats.late += 1
                after = self._lost_at.pop(ext, None)
                if after is not None:
                    self._reach.saw(now - after, now)
                self._wait = min(self.cfg.max_wait, self._wait * 1.5 + self.cfg.ptime)
                self.stats.wait_ms = self._gap_wait(now) * 1000
            else:
                self._count_duplicate(audio)
            return
        if ext in self._buf:
            self._count_duplicate(audio)
            return
        if ext < self._max_ext:
            self.stats.reordered += 1
            # it fills a gap in time: the gap opened when the first packet after it came
            self._reach.saw(now - min(at for e, (_, at) in self._buf.items() if e > ext), now)
            self.stats.wait_ms = self._gap_wait(now) * 1000
        if audio:
            self._update_jitter(pkt, now)
        self._buf[ext] = (pkt, now)
        self._max_ext = max(self._max_ext, ext)
        self.stats.max_depth = max(self.stats.max_depth, len(self._buf))

    def pop(self, now: float) -> list[Out]:
        """Everything that may leave at `now`: in-order packets, and gaps whose wait expired."""
        self._now = max(self._now, now)
        wait = self._gap_wait(now)
        self.stats.wait_ms = wait * 1000
        return self._take(now, wait)

    def _take(self, now: float, wait: float) -> list[Out]:
        out, self._pending = self._pending, []
        while self._buf:
            entry = self._buf.pop(self._next, None)
            if entry is not None:
                self._release(entry[0], out)
                continue
            oldest = min(arrival for _, arrival in self._buf.values())
            if len(self._buf) < self.cfg.capacity and now < oldest + wait:
                break
            if len(self._buf) >= self.cfg.capacity:
                self.stats.forced += 1
            self._give_up(min(self._buf), out)
        return out

    def next_deadline(self) -> float | None:
        """When `pop` will next release something without a new arrival (None: not waiting)."""
        if self._pending:
            return float("-inf")
        if not self._buf or self._next in self._buf:
            return None
        return min(arrival for _, arrival in self._buf.values()) + self._gap_wait(self._now)

    def drain(self) -> list[Out]:
        """Release everything held (end of call, or a resync): gaps are declared lost; the
        clock and the learnt wait are left as they were."""
        return self._take(float("inf"), 0.0)

    # -------------------------------------------------------------------------- internals

    def _extend(self, seq: int) -> int:
        """The extended sequence number nearest to the highest one accepted (RFC 3550 A.1)."""
        return self._max_ext + ((seq - self._max_ext + 0x8000) & 0xFFFF) - 0x8000

    def _foreign(self, pkt: RtpPacket) -> bool:
        """Another source, or a sequence number too far from the stream's to be believed."""
        return pkt.ssrc != self._ssrc or \
            abs(self._extend(pkt.seq) - self._next) > self.cfg.max_jump

    def _restart(self, pkt: RtpPacket) -> None:
        self._ssrc, self._next = pkt.ssrc, pkt.seq + 0x10000   # +2^16 keeps ext seqs positive
        self._start = self._max_ext = self._next
        self._last, self._transit = None, None
        self._lost.clear()
        self._lost_at.clear()

    def _on_probation(self, pkt: RtpPacket, now: float) -> bool:
        """A far jump or a foreign SSRC: believe it (resync) on the second packet in a row."""
        probe, self._probe = self._probe, pkt
        if probe is None or probe.ssrc != pkt.ssrc or (probe.seq + 1) & 0xFFFF != pkt.seq:
            self.stats.jumped += 1          # dropped, unless the next packet confirms it
            return False
        self.stats.jumped -= 1              # the probe joins the new stream after all
        self.stats.resyncs += 1
        self._pending.extend(self.drain())  # the old stream's tail leaves first
        self._restart(probe)
        self._probe = None
        self._buf[self._next] = (probe, now)
        return True

    def _release(self, pkt: RtpPacket, out: list[Out]) -> None:
        if not pkt.payload:                # an event: nothing to hear, nothing to size gaps by
            out.append(Out(self._next, None))
            self.stats.events += 1
            self._next += 1
            return
        out.append(Out(self._next, pkt.payload))
        self.stats.played += 1
        self._last = pkt
        self._next += 1
        base = max(self.cfg.min_wait, 4 * self._jitter)
        self._wait = min(self.cfg.max_wait, max(base, self._wait + (base - self._wait) / 256))

    def _give_up(self, first: int, out: list[Out]) -> None:
        """Declare [next, first) lost and conceal them with silence sized by the timestamps."""
        missing = first - self._next
        spp = self.cfg.samples_per_packet
        samples = missing * spp
        if self._last is not None:
            nxt = self._buf[first][0]
            gap = (nxt.timestamp - self._last.timestamp - len(self._last.payload)) & 0xFFFFFFFF
            if gap <= missing * spp * 4:                    # trust timestamps that make sense
                samples = gap
        after = self._buf[first][1]
        per, extra = divmod(samples, missing)
        for i in range(missing):
            size = per + (extra if i == missing - 1 else 0) if i < self.cfg.max_conceal else 0
            payload = bytes([self.silence]) * size if size else None
            out.append(Out(self._next, payload, lost=True))
            self.stats.concealed += payload is not None
            self._remember_lost(self._next, after)
            self._next += 1
        self.stats.lost += missing

    def _count_duplicate(self, audio: bool) -> None:
        if audio:
            self.stats.duplicate += 1
        else:
            self.stats.repeated += 1

    def _remember_lost(self, ext: int, after: float) -> None:
        if len(self._lost) == self._lost.maxlen:
            self._lost_at.pop(self._lost[0], None)
        self._lost.append(ext)
        self._lost_at[ext] = after

    def _gap_wait(self, now: float) -> float:
        """How long a gap is held at `now` (module doc)."""
        return min(self.cfg.max_wait, max(self._wait, self._reach.wait_s(now, self.cfg.min_wait)))

    def _update_jitter(self, pkt: RtpPacket, now: float) -> None:
        transit = now - pkt.timestamp / self.cfg.rate
        if self._transit is not None:
            d = abs(transit - self._transit)
            if d < 10.0:                                    # ignore timestamp wraps
                self._jitter += (d - self._jitter) / 16
        self._transit = transit
        self.stats.jitter_ms = self._jitter * 1000
