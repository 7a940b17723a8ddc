"""Strict RTP at the bridge, over real UDP sockets on loopback with the scripted fake node: a
call's media is latched to the caller's SDP address (or, without a usable one, to the first
valid sender); RTP from any other source never reaches the node and is counted; a re-INVITE
re-latches; and a stranger who keeps sending cannot keep a call whose caller went quiet alive.

Timeouts are shortened to half a second, real time: the waits below only bound how long a test
looks for something, they never assert how fast it came.
"""
import asyncio
from dataclasses import replace

from tests.transports.sipkit import CFG, M, establish, run
from transports.sip.media import rtp

QUIET = b"\xfe" * 160                    # PCMU near silence: the caller
LOUD = b"\x80\x00" * 80                  # PCMU full scale, both signs: what an injector plays
LOUD_BYTES = set(LOUD)


class Media(asyncio.DatagramProtocol):
    """One RTP socket on loopback (a caller's, or a stranger's on another port)."""

    def __init__(self):
        self.transport = None
        self.rx: list[bytes] = []

    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        self.rx.append(data)

    @classmethod
    async def open(cls) -> "Media":
        loop = asyncio.get_running_loop()
        _, media = await loop.create_datagram_endpoint(cls, local_addr=("127.0.0.1", 0))
        return media

    @property
    def port(self) -> int:
        return self.transport.get_extra_info("sockname")[1]

    def send(self, data: bytes, dest) -> None:
        self.transport.sendto(data, dest)


def sdp_offer(port: int, ip: str = "127.0.0.1") -> bytes:
    return (f"v=0\r\no=ua 1 1 IN IP4 {ip}\r\ns=-\r\nc=IN IP4 {ip}\r\nt=0 0\r\n"
            f"m=audio {port} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n").encode()


def rtp_dest(ok: M.SipMessage) -> tuple[str, int]:
    return ("127.0.0.1", int(ok.body.split(b"m=audio ")[1].split()[0]))


async def until(pred, timeout=5.0) -> bool:
    """Poll `pred` until it holds (a loaded machine may need a while to read the sockets)."""
    for _ in range(int(timeout / 0.02)):
        if pred():
            return True
        await asyncio.sleep(0.02)
    return pred()


async def hang_up(bridge, ua, events, tag, cseq=2):
    ua.request(bridge.address, "BYE", "c1", cseq=cseq, to_tag=tag)
    assert (await ua.final()).status == 200
    assert await until(lambda: any(e["event"] == "call_end" for e in events))


def heard(node, call) -> bytes:
    return bytes(node.audio.get(call.session_id, b""))


def call_end(events) -> dict:
    (end,) = [e for e in events if e["event"] == "call_end"]
    return end


def test_rtp_injected_from_another_port_never_reaches_the_node_and_is_counted():
    """The probe's attack: a second socket floods loud RTP with its own SSRC (two packets per
    tick, so the jitter buffer would believe the new SSRC) while the caller talks."""
    n = 40

    async def scenario(bridge, node, ua, events):
        caller, stranger = await Media.open(), await Media.open()
        ok, tag = await establish(bridge, ua, body=sdp_offer(caller.port))
        dest, (call,) = rtp_dest(ok), bridge.calls
        voice, loud = rtp.RtpSender(0), rtp.RtpSender(0)
        for _ in range(n):
            caller.send(voice.packet(QUIET, 160), dest)
            stranger.send(loud.packet(LOUD, 160), dest)
            stranger.send(loud.packet(LOUD, 160), dest)
            await asyncio.sleep(0.02)
        await until(lambda: heard(node, call).count(QUIET[0]) >= n * 160
                    or LOUD_BYTES & set(heard(node, call)))
        assert not LOUD_BYTES & set(heard(node, call)), "injected audio reached the node"
        assert heard(node, call).count(QUIET[0]) == n * 160      # the caller, all of it
        assert await until(lambda: call.stats.rtp_foreign == 2 * n), call.stats
        assert call.jitter.stats.played == n and call.jitter.stats.resyncs == 0
        await hang_up(bridge, ua, events, tag)
    end = call_end(run(scenario))
    assert end["rtp"]["rtp_foreign"] == 2 * n                  # reported in the call's summary
    assert end["rtp_source_learned"] is False


def test_reinvite_relatches_to_the_new_sdp_address():
    """A re-INVITE moves the caller's media to another socket: the new one is heard at once,
    the old address becomes a stranger."""
    n = 25

    async def scenario(bridge, node, ua, events):
        old, new = await Media.open(), await Media.open()
        ok, tag = await establish(bridge, ua, body=sdp_offer(old.port))
        dest, (call,) = rtp_dest(ok), bridge.calls
        first = rtp.RtpSender(0)
        for _ in range(5):
            old.send(first.packet(b"\x22" * 160, 160), dest)
            await asyncio.sleep(0.02)
        assert await until(lambda: heard(node, call).count(0x22) == 5 * 160)
        ua.request(bridge.address, "INVITE", "c1", cseq=2, to_tag=tag, body=sdp_offer(new.port))
        assert (await ua.final()).status == 200
        ua.request(bridge.address, "ACK", "c1", cseq=2, to_tag=tag)
        moved = rtp.RtpSender(0)
        for _ in range(n):                     # the old address goes on (loud), the new talks
            old.send(first.packet(LOUD, 160), dest)
            new.send(moved.packet(b"\x33" * 160, 160), dest)
            await asyncio.sleep(0.02)
        await until(lambda: heard(node, call).count(0x33) >= (n - 1) * 160
                    or LOUD_BYTES & set(heard(node, call)))
        assert not LOUD_BYTES & set(heard(node, call)), "the old address is still heard"
        # the new SSRC is believed on its second packet (jitter probation): n - 1 of n played
        assert heard(node, call).count(0x33) >= (n - 1) * 160
        assert call.latch.source == ("127.0.0.1", new.port)
        assert await until(lambda: call.stats.rtp_foreign == n), call.stats
        await hang_up(bridge, ua, events, tag, cseq=3)
    run(scenario)


def test_without_a_usable_sdp_address_the_first_valid_sender_is_latched():
    """c=0.0.0.0 says nothing about where the caller sends from: garbage does not latch, the
    first valid RTP does, and a later stranger is dropped."""
    async def scenario(bridge, node, ua, events):
        caller, stranger = await Media.open(), await Media.open()
        ok, tag = await establish(bridge, ua, body=sdp_offer(caller.port, "0.0.0.0"))
        dest, (call,) = rtp_dest(ok), bridge.calls
        stranger.send(b"\x80\x00garbage", dest)                 # not RTP: learns nothing
        assert await until(lambda: call.stats.rtp_bad == 1)
        voice, loud = rtp.RtpSender(0), rtp.RtpSender(0)
        for _ in range(20):
            caller.send(voice.packet(QUIET, 160), dest)
            stranger.send(loud.packet(LOUD, 160), dest)
            stranger.send(loud.packet(LOUD, 160), dest)
            await asyncio.sleep(0.02)
        await until(lambda: heard(node, call).count(QUIET[0]) >= 20 * 160
                    or LOUD_BYTES & set(heard(node, call)))
        assert not LOUD_BYTES & set(heard(node, call)), "injected audio reached the node"
        assert call.latch.source == ("127.0.0.1", caller.port) and call.latch.learned
        assert await until(lambda: call.stats.rtp_foreign == 40), call.stats
        await hang_up(bridge, ua, events, tag)
    run(scenario)


def test_a_stranger_sending_rtp_cannot_keep_a_call_alive_after_the_caller_stops():
    """The probe's second finding: the caller went quiet, a stranger kept sending, and the call
    got no BYE. The RTP timeout runs from the latched source's last packet."""
    cfg = replace(CFG, rtp_timeout=0.5)

    async def scenario(bridge, node, ua, events):
        caller, stranger = await Media.open(), await Media.open()
        ok, tag = await establish(bridge, ua, body=sdp_offer(caller.port))
        dest, (call,) = rtp_dest(ok), bridge.calls
        voice, loud = rtp.RtpSender(0), rtp.RtpSender(0)
        for _ in range(10):
            caller.send(voice.packet(QUIET, 160), dest)
            await asyncio.sleep(0.02)

        async def flood():
            while True:
                stranger.send(loud.packet(LOUD, 160), dest)
                await asyncio.sleep(0.02)
        flooding = asyncio.get_running_loop().create_task(flood())
        try:                                    # 12 timeouts: time enough on a loaded machine
            bye = await ua.next(timeout=6.0, pred=lambda m: m.is_request)
        except asyncio.TimeoutError:
            raise AssertionError("no BYE while a stranger kept sending RTP") from None
        finally:
            flooding.cancel()
        assert bye.method == "BYE"
        ua.transport.sendto(M.make_response(bye, 200).to_bytes(), bridge.address)
        assert await until(lambda: any(e["event"] == "call_end" for e in events))
    end = call_end(run(scenario, cfg=cfg))
    assert end["reason"] == "rtp_timeout" and end["rtp"]["rtp_foreign"] > 0


def test_sdp_addresses_are_trusted_unless_unspecified_or_private_behind_a_nat():
    from transports.sip.media.latch import SourceLatch, usable
    public, home = "81.2.69.142", "192.168.1.10"
    assert usable((public, 4000), "93.184.216.34")
    assert usable((home, 4000), "192.168.1.20")              # a LAN: private both ways
    assert not usable((home, 4000), "93.184.216.34")         # private SDP, public signalling
    assert not usable(("0.0.0.0", 4000), home) and not usable(None, home)
    assert not usable((public, 0), public)
    latch = SourceLatch("93.184.216.34")
    latch.expect((home, 4000))
    assert latch.source is None                              # learning
    latch.learn(("93.184.216.34", 31000))
    latch.expect(None)                                       # hold keeps the learned source
    latch.expect((home, 4000))                               # so does the same address again
    assert latch.admits(("93.184.216.34", 31000)) and not latch.admits((public, 31000))
    latch.expect((public, 5000))                             # a usable address re-latches
    assert latch.source == (public, 5000) and latch.changes == 2
