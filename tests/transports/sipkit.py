"""The SIP bridge's tests' kit: a scripted fake node (`FakeNode`), a SIP user agent on loopback
(`UA`), an SDP offer, a bridge with shortened timers run against both (`run`), and a call set up
(`establish`)."""
import asyncio
import os
from dataclasses import replace

import zmq
import zmq.asyncio

from transports import protocol as P
from transports.sip import message as M
from transports.sip.config import BridgeConfig
from transports.sip.server import Bridge

FRAME = 640                             # 80 ms of G.711 at 8 kHz


class FakeNode:
    """A ROUTER speaking the wire protocol: opens up to `slots` sessions, answers each beat
    (160 ms) with two 80 ms frames, records audio received, and can close a session itself."""

    def __init__(self, slots=4, refuse=None, open_delay=0.0):
        self.slots, self.refuse, self.open_delay = slots, refuse, open_delay
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.live: dict[str, bytes] = {}          # session -> client identity
        self.audio_in: dict[str, int] = {}        # session -> bytes received
        self.audio: dict[str, bytearray] = {}     # session -> the bytes themselves
        self.opens, self.closes = [], []
        self.events: dict[str, list] = {}         # session -> (name, value) of each `event`
        self.answered: list[tuple[str, str]] = []  # (session, what the open was answered)
        self.errors: list[str] = []               # messages this node could not handle
        self.tasks: list[asyncio.Task] = []
        self._opening: set[asyncio.Task] = set()  # the loop keeps only weak references

    def start(self):
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self._recv()), loop.create_task(self._beats())]

    async def stop(self):
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.sock.close(0)
        self.ctx.term()

    async def _send(self, ident, frames):
        await self.sock.send_multipart([ident, *frames])

    async def _recv(self):
        while True:
            ident, *frames = await self.sock.recv_multipart()
            try:
                await self._handle(ident, frames)
            except Exception as exc:          # one bad message must not leave opens unanswered
                self.errors.append(repr(exc))

    async def _handle(self, ident, frames):
        msg = P.parse(frames)
        if msg.type == "open":
            self.opens.append(msg.header)
            task = asyncio.get_running_loop().create_task(self._open(ident, msg))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)
        elif msg.type == "audio":
            self.audio_in[msg.session] = self.audio_in.get(msg.session, 0) + len(msg.payload)
            self.audio.setdefault(msg.session, bytearray()).extend(msg.payload)
        elif msg.type == "event":
            self.events.setdefault(msg.session, []).append(
                (msg.header["name"], msg.header["value"]))
        elif msg.type == "close":
            self.closes.append(msg.session)
            if self.live.pop(msg.session, None) is not None:
                await self._send(ident, P.pack("closed", msg.session, stats=self.stats(msg)))
            else:
                await self._send(ident, P.error_frames(P.UNKNOWN_SESSION, "no", msg.session))

    def stats(self, msg):
        return {"frames_in": self.audio_in.get(msg.session, 0) // FRAME, "frames_out": 1,
                "underruns": 0, "dropped": 0, "late_beats": 0}

    async def _open(self, ident, msg):
        await asyncio.sleep(self.open_delay)
        if self.refuse or len(self.live) >= self.slots:
            await self._send(ident, P.pack("refused", msg.session,
                                           reason=self.refuse or "capacity", message="no"))
            self.answered.append((msg.session, "refused"))
            return
        self.live[msg.session] = ident
        self.answered.append((msg.session, "opened"))
        await self._send(ident, P.pack("opened", msg.session, frame_ms=80, beat_ms=160,
                                       output_sample_rate=8000, output_format=msg.header["format"]))

    async def _beats(self):
        seq = 0
        while True:
            await asyncio.sleep(0.16)
            for sid, ident in list(self.live.items()):
                for _ in range(2):
                    await self._send(ident, P.pack("audio", sid, b"\x11" * FRAME, seq=seq,
                                                   frame=seq))
                    seq += 1

    async def kill(self, session):
        ident = self.live.pop(session)
        await self._send(ident, P.pack("closed", session, stats={"frames_in": 0}))


class UA(asyncio.DatagramProtocol):
    """A test SIP user agent on loopback: sends text requests, collects whatever comes back."""

    def __init__(self):
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        self.inbox.put_nowait(M.parse(data))

    @classmethod
    async def create(cls):
        loop = asyncio.get_running_loop()
        _, ua = await loop.create_datagram_endpoint(cls, local_addr=("127.0.0.1", 0))
        return ua

    @property
    def port(self):
        return self.transport.get_extra_info("sockname")[1]

    def request(self, dest, method, call_id, *, cseq=1, to_tag="", body=b"", branch=None,
                extra=(), ctype="application/sdp", contact=True):
        branch = branch or "z9hG4bK" + os.urandom(4).hex()
        lines = [f"{method} sip:wave@127.0.0.1:{dest[1]} SIP/2.0",
                 f"Via: SIP/2.0/UDP 127.0.0.1:{self.port};branch={branch}",
                 f"From: <sip:ua@127.0.0.1:{self.port}>;tag=ua1",
                 "To: <sip:wave@127.0.0.1>" + (f";tag={to_tag}" if to_tag else ""),
                 f"Call-ID: {call_id}", f"CSeq: {cseq} {method}", "Max-Forwards: 70", *extra]
        if contact:
            lines.append(f"Contact: <sip:ua@127.0.0.1:{self.port}>")
        if body:
            lines.append(f"Content-Type: {ctype}")
        data = ("\r\n".join(lines) + f"\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        self.transport.sendto(data, dest)
        return branch

    async def next(self, timeout=8.0, pred=lambda m: True):
        while True:
            msg = await asyncio.wait_for(self.inbox.get(), timeout)
            if pred(msg):
                return msg

    async def final(self, timeout=10.0, call_id=None):
        """The next final response (to `call_id` only, when given: a refused INVITE's final is
        resent until its ACK, and may come again while another request waits)."""
        return await self.next(timeout, lambda m: not m.is_request and m.status >= 200 and
                               call_id in (None, m.get("Call-ID")))


def offer(port, fmt=0, name="PCMU"):
    return (f"v=0\r\no=ua 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
            f"m=audio {port} RTP/AVP {fmt}\r\na=rtpmap:{fmt} {name}/8000\r\n").encode()


# open_timeout: room for a loaded machine (the UA waits 10 s for the final answer); the open's
# own timeout is tested with a shorter one.
CFG = BridgeConfig(port=0, t1=0.05, t2=0.2, open_timeout=8.0, rtp_timeout=5.0,
                   node_timeout=5.0)


_running: dict = {}                     # bridge -> its fake node, while `run` runs them


def run(coro_fn, node_kw=None, cfg=CFG, timeout=40):
    """Run `coro_fn(bridge, node, ua, events)` with a fake node and a bridge on loopback."""
    async def main():
        node = FakeNode(**(node_kw or {}))
        node.start()
        events = []
        bridge = Bridge(replace(cfg, node=node.endpoint),
                        emit=lambda ev, **f: events.append({"event": ev, **f}))
        await bridge.start()
        _running[bridge] = node
        ua = await UA.create()
        try:
            await asyncio.wait_for(coro_fn(bridge, node, ua, events), timeout)
        finally:
            ua.transport.close()
            await bridge.close(timeout=0.3)
            await node.stop()
            _running.pop(bridge, None)
        assert bridge.stats.internal_errors == 0, events
        assert not node.errors, node.errors
        return events
    return asyncio.run(main())


async def establish(bridge, ua, call_id="c1", body=None):
    """INVITE -> 100/180/200 -> ACK; returns the 200 OK. Only answers to this call count (a
    loopback port may have served another bridge's caller moments before)."""
    t0 = asyncio.get_running_loop().time()
    ua.request(bridge.address, "INVITE", call_id, body=offer(9) if body is None else body)
    seen = [(await ua.next(pred=lambda m: not m.is_request and m.get("Call-ID") == call_id))
            .status]
    ok = await ua.final(call_id=call_id)
    seen += [ok.status]
    # the bridge's Warning says why a call was refused (no RTP port, node unavailable, ...);
    # the node's side says whether the open reached it and what it answered
    assert ok.status == 200, (ok.start_line(), ok.get("Warning"), seen, _node_side(bridge),
                               f"{asyncio.get_running_loop().time() - t0:.2f} s")
    tag = M.parse_name_addr(ok.get("To")).tag
    ua.request(bridge.address, "ACK", call_id, to_tag=tag)
    return ok, tag


def _node_side(bridge) -> dict:
    client, node = bridge.client, _running.get(bridge)
    side = {"handshakes": getattr(client, "_handshakes", None),
            "bridge_stats": bridge.stats.as_dict()}
    if node is not None:
        side.update(opens=len(node.opens), answered=node.answered, errors=node.errors)
    return side
