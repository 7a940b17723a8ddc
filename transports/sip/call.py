"""The media half of one phone call: caller RTP -> jitter buffer -> node, node -> playout -> RTP.

One `Call` owns one UDP socket for RTP and one node session, and runs three tasks:

- tick (every 20 ms, drift-free): releases jitter-buffer gaps whose wait expired, feeds the node
  silence while the caller sends nothing (so that its input never starves), sends one RTP packet
  from the playout buffer, checks the RTP and node timeouts;
- uplink: G.711 bytes released by the jitter buffer -> node `audio` messages (a bounded queue;
  whatever queued up while a send was in flight leaves as one message);
- downlink: node events -> playout buffer (audio), counters (text, errors), end of call (closed).

The node session is opened with the caller's law at 8 kHz in both directions (`pcmu`/`pcma`,
output_sample_rate 8000): the node resamples and encodes, so the bridge never touches samples.
Whatever ends the call from the media side (RTP timeout, node closed or silent) is reported once
through `on_end(call, reason)`; the SIP side then sends BYE and calls `stop`.

Caller media is accepted from one source only (`latch.SourceLatch`: the SDP address, or the first
valid sender when that is unusable); everything else is counted as `rtp_foreign` and dropped.
The RTP timeout runs from the last packet accepted from that source, so a stranger who keeps
sending can neither talk into the call nor keep a dead one alive.

DTMF keys (RFC 4733 telephone-event, when the answer agreed on it) are parsed by
`dtmf.DtmfReceiver`, each press reported once through `on_key(call, key)`; their packets keep
the call alive like audio does, hold their sequence numbers in the jitter buffer, and are never
counted as bad or wrong-payload RTP. Each key goes to the node as an `event` (`name: "dtmf"`,
`value`: the key; `send_key`), which the node hands the model as a tool response in its
function channel, the one way text reaches the model during a call.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
from dataclasses import asdict, dataclass, replace
from typing import Callable

from transports import client as C
from transports.sip import sockbuf
from transports.sip.config import BridgeConfig
from transports.sip.media import dtmf, rtp
from transports.sip.media.jitter import JitterBuffer
from transports.sip.media.latch import SourceLatch
from transports.sip.media.pacer import Clock, MonotonicClock, Playout, ticks
from transports.sip.sdp import Answer, Codec
from wave_actors.core.tasks import stop_tasks, within


@dataclass
class CallStats:
    rtp_in: int = 0             # datagrams on the RTP port
    rtp_bad: int = 0            # not RTP, or empty: dropped
    rtcp_in: int = 0            # RTCP multiplexed on the RTP port: ignored
    wrong_pt: int = 0           # a payload type we did not negotiate: dropped
    rtp_early: int = 0          # arrived before the call was answered: dropped
    rtp_foreign: int = 0        # from a source other than the latched one: dropped
    rtp_out: int = 0
    uplink_dropped: int = 0     # packets the node link could not take (queue full)
    silence_fill: int = 0       # 20 ms of silence sent to the node while the caller was quiet
    node_audio: int = 0         # node audio frames received
    node_text: int = 0
    node_errors: int = 0


NODE_ERRORS = (asyncio.TimeoutError, OSError, C.NodeUnavailable)


def _close_if_opened(opening: asyncio.Future) -> None:
    if not opening.cancelled() and opening.exception() is None:
        asyncio.ensure_future(_quietly(opening.result().close(3.0)))


async def _quietly(awaitable) -> None:
    try:
        await awaitable
    except NODE_ERRORS:
        pass


class _RtpProtocol(asyncio.DatagramProtocol):
    def __init__(self, call: "Call"):
        self.call = call

    def datagram_received(self, data: bytes, addr) -> None:
        try:
            self.call.on_rtp(data, addr)
        except Exception:                      # never let one datagram take the call down
            self.call.stats.rtp_bad += 1

    def error_received(self, exc: Exception) -> None:   # ICMP port unreachable and the like
        pass


async def bind_rtp(cfg: BridgeConfig, call: "Call") -> asyncio.DatagramTransport:
    """A UDP socket for the call's RTP: an even port of cfg.rtp_ports, or an ephemeral one."""
    loop = asyncio.get_running_loop()
    lo, hi = cfg.rtp_ports
    ports = [0] if lo == 0 else list(range(lo + lo % 2, hi + 1, 2))
    start = random.randrange(len(ports))
    for port in (ports[start:] + ports[:start])[:64]:
        try:
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _RtpProtocol(call), local_addr=(cfg.rtp_ip, port))
        except OSError:
            continue
        sock = transport.get_extra_info("socket")
        sockbuf.size(sock, "rcvbuf", cfg.rtp_rcvbuf)
        sockbuf.size(sock, "sndbuf", cfg.rtp_sndbuf)
        return transport
    raise OSError("no free RTP port")


class Call:
    def __init__(self, cfg: BridgeConfig, sip_call_id: str, codec: Codec,
                 on_end: Callable[["Call", str], None], clock: Clock | None = None,
                 signalling_host: str | None = None,
                 on_key: Callable[["Call", dtmf.Key], None] | None = None):
        self.cfg, self.sip_call_id, self.codec = cfg, sip_call_id, codec
        self.session_id = "sip-" + os.urandom(8).hex()
        self.clock = clock or MonotonicClock()
        self._on_end, self._on_key = on_end, on_key
        self.stats = CallStats()
        self.latch = SourceLatch(signalling_host)   # where the INVITE came from: NAT detection
        self.jitter = JitterBuffer(replace(cfg.jitter, rate=codec.rate), codec.silence)
        self.playout = Playout(replace(cfg.playout, rate=codec.rate, silence=codec.silence))
        self.sender = rtp.RtpSender(codec.pt)
        self.dtmf = dtmf.DtmfReceiver()
        self.event_pt: int | None = None        # telephone-event's payload type, once agreed
        self.transport: asyncio.DatagramTransport | None = None
        self.session: C.ClientSession | None = None
        self.answer: Answer | None = None
        self.node_closed: C.Closed | None = None
        self.end_reason: str | None = None
        self._uplink: asyncio.Queue[bytes] = asyncio.Queue(cfg.uplink_queue)
        self._tasks: list[asyncio.Task] = []
        self._last_rtp = self._last_node = 0.0
        self._last_audio = 0.0                  # a key held down keeps the call, not the voice
        self._stop_task: asyncio.Task | None = None

    @property
    def local_port(self) -> int:
        return self.transport.get_extra_info("sockname")[1]

    async def bind(self) -> None:
        self.transport = await bind_rtp(self.cfg, self)

    async def open_node(self, client: C.NodeClient) -> None:
        """Open the node session within `open_timeout`; raises client.Refused, TimeoutError or
        client.NodeUnavailable.

        Giving up (timeout, or a CANCEL from the caller) does not abandon the `open` in flight:
        it goes on in the background for as long again, and a session that opens after all is
        closed at once rather than left holding a slot."""
        law = self.codec.law
        opening = asyncio.ensure_future(client.open(
            self.session_id, sample_rate=self.codec.rate, format=law,
            timeout=2 * self.cfg.open_timeout, output_sample_rate=self.codec.rate,
            output_format=law, instructions=self.cfg.instructions))
        try:
            self.session = await within(asyncio.shield(opening),
                                                  self.cfg.open_timeout)
        except (asyncio.CancelledError, asyncio.TimeoutError):
            opening.add_done_callback(_close_if_opened)
            raise

    def start(self, answer: Answer) -> None:
        """Media flows from here on (the 200 OK with our answer has been sent)."""
        self.answer = answer
        self.event_pt = answer.event_pt if answer else None
        self.latch.expect(answer.remote if answer else None)
        self._last_rtp = self._last_node = self._last_audio = self.clock.now()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._tick_loop()), loop.create_task(self._uplink_loop()),
                       loop.create_task(self._downlink_loop())]

    def update(self, answer: Answer) -> None:
        """A re-INVITE (or the caller's answer in the ACK) changed where or whether media flows:
        re-latch to its address; the RTP timeout starts afresh."""
        self.answer = answer
        self.event_pt = answer.event_pt
        self.latch.expect(answer.remote)
        self._last_rtp = self.clock.now()

    def on_rtp(self, data: bytes, addr) -> None:
        self.stats.rtp_in += 1
        if not self._tasks:                    # before our 200 OK: nothing to feed yet
            self.stats.rtp_early += 1
            return
        if not self.latch.admits(addr):
            self.stats.rtp_foreign += 1
            return
        if rtp.is_rtcp(data):
            self.stats.rtcp_in += 1
            return
        try:
            pkt = rtp.parse(data)
        except rtp.RtpError:
            self.stats.rtp_bad += 1
            return
        if pkt.payload_type == self.event_pt:
            self._on_event_packet(pkt, addr)
            return
        if pkt.payload_type != self.codec.pt:
            self.stats.wrong_pt += 1
            return
        if not pkt.payload:
            self.stats.rtp_bad += 1
            return
        self.latch.learn(addr)
        now = self.clock.now()
        self._last_rtp = self._last_audio = now   # only the latched source keeps the call alive
        self.jitter.push(pkt, now)
        self._flush_jitter(now)

    def _on_event_packet(self, pkt: rtp.RtpPacket, addr) -> None:
        try:
            keys = self.dtmf.push(pkt, self.clock.now())
        except dtmf.DtmfError:
            self.stats.rtp_bad += 1
            return
        self.latch.learn(addr)
        now = self.clock.now()
        self._last_rtp = now
        self.jitter.push(pkt, now, audio=False)
        self._flush_jitter(now)
        for key in keys:
            self._key(key)

    def _key(self, key: dtmf.Key) -> None:
        """One key press, reported once."""
        if self._on_key is not None:
            self._on_key(self, key)

    def send_key(self, digit: str) -> bool:
        """The key to the node session, if one is open (sent in the background: a key never
        waits on the node); whether it was sent."""
        if self.session is None or self.session.closed is not None:
            return False
        asyncio.ensure_future(_quietly(self.session.send_event("dtmf", digit)))
        return True

    def _flush_jitter(self, now: float) -> None:
        for out in self.jitter.pop(now):
            if out.payload is None:
                continue
            try:
                self._uplink.put_nowait(out.payload)
            except asyncio.QueueFull:
                self.stats.uplink_dropped += 1

    async def _tick_loop(self) -> None:
        spp = self.playout.cfg.samples_per_packet
        async for skipped in ticks(self.clock, self.playout.cfg.ptime,
                                   self.playout.cfg.max_catchup):
            now = self.clock.now()
            if skipped and self.playout.started:
                self.playout.stats.skipped_ticks += skipped
                self.sender.skip(skipped * spp)
            self._flush_jitter(now)
            self._fill_silence(now)
            payload = self.playout.take()
            if payload is not None:
                if self.answer is not None and self.answer.we_send:
                    self.transport.sendto(self.sender.packet(payload, spp), self.answer.remote)
                    self.stats.rtp_out += 1
                else:
                    self.sender.skip(spp)               # on hold: time moves on, nothing sent
            self._check_timeouts(now)

    def _fill_silence(self, now: float) -> None:
        """A caller that pauses (silence suppression, a key held down, or before its first
        packet) would starve the node's frames: after `fill_after` without audio, feed it
        silence in real time."""
        if self.jitter.depth == 0 and now - self._last_audio > self.cfg.fill_after:
            try:
                spp = self.playout.cfg.samples_per_packet
                self._uplink.put_nowait(bytes([self.codec.silence]) * spp)
                self.stats.silence_fill += 1
            except asyncio.QueueFull:
                self.stats.uplink_dropped += 1

    def _check_timeouts(self, now: float) -> None:
        if self.answer is not None and self.answer.peer_sends and \
                now - self._last_rtp > self.cfg.rtp_timeout:
            self._end("rtp_timeout")
        elif now - self._last_node > self.cfg.node_timeout:
            self._end("node_timeout")

    async def _uplink_loop(self) -> None:
        while True:
            chunks = [await self._uplink.get()]
            while not self._uplink.empty():
                chunks.append(self._uplink.get_nowait())
            try:
                await self.session.send_audio(b"".join(chunks))
            except C.NodeUnavailable:
                self._end("node_unavailable")
                return

    async def _downlink_loop(self) -> None:
        while True:
            ev = await self.session.next_event()
            self._last_node = self.clock.now()
            if isinstance(ev, C.Audio):
                self.stats.node_audio += 1
                self.playout.push(ev.payload)
            elif isinstance(ev, C.Text):
                self.stats.node_text += 1
            elif isinstance(ev, C.FunctionCall):       # phone calls offer no tools
                await _quietly(self.session.function_result(ev.call_id, json.dumps(
                    {"error": "no tools are available on this call"})))
            elif isinstance(ev, C.Closed):
                self.node_closed = ev
                self._end("node_closed")
                return
            else:
                self.stats.node_errors += 1

    def _end(self, reason: str) -> None:
        if self.end_reason is None:
            self.end_reason = reason
            self._on_end(self, reason)

    def stop(self, reason: str, close_timeout: float = 3.0) -> "asyncio.Task[dict]":
        """Tear the call down once; every caller awaits the same task, which returns the call's
        summary (node `closed` stats included)."""
        if self.end_reason is None:
            self.end_reason = reason
        if self._stop_task is None:
            self._stop_task = asyncio.get_running_loop().create_task(self._stop(close_timeout))
        return self._stop_task

    async def _stop(self, close_timeout: float) -> dict:
        await stop_tasks(self._tasks)
        # Ended tasks hold tracebacks whose frames hold this call: kept, they would hold the
        # ended call (jitter buffer, resamplers) in a cycle until a full collection.
        self._tasks = []
        node_stats, node_error = None, None
        if self.session is not None:
            try:
                closed = self.node_closed or await self.session.close(close_timeout)
                node_stats = closed.stats
            except NODE_ERRORS as exc:
                node_error = type(exc).__name__
        if self.transport is not None:
            self.transport.close()
        return {"call_id": self.sip_call_id, "session": self.session_id,
                "reason": self.end_reason, "codec": self.codec.name, "node_stats": node_stats,
                "node_error": node_error, "rtp": asdict(self.stats),
                "rtp_source": self.latch.source, "rtp_source_learned": self.latch.learned,
                "jitter": self.jitter.stats.as_dict(), "playout": self.playout.stats.as_dict(),
                "dtmf": self.dtmf.stats.as_dict(),
                "sent_packets": self.sender.sent}
