"""The bridge in-process against a scripted fake node: SIP transactions and dialogs (CANCEL,
retransmissions, ACK timeout, re-INVITE, late offer), errors, node refusal and node-side close
(-> BYE to the caller), RTP garbage. Timers are shortened; each test runs in well under a second
or two of wall time.
"""
import asyncio
import os
from dataclasses import replace

import pytest

from transports.sip import sockbuf
from transports.sip.media import rtp
from tests.transports.sipkit import CFG, M, establish, offer, run

def test_call_flow_and_node_close_sends_bye():
    async def scenario(bridge, node, ua, events):
        ok, tag = await establish(bridge, ua)
        assert ok.get("Content-Type") == "application/sdp" and b"RTP/AVP 0" in ok.body
        assert M.parse_name_addr(ok.get("Contact")).uri.startswith("sip:wave@127.0.0.1:")
        (hdr,) = node.opens
        assert (hdr["sample_rate"], hdr["format"], hdr["output_sample_rate"],
                hdr["output_format"]) == (8000, "pcmu", 8000, "pcmu")
        await asyncio.sleep(0.4)
        (sid,) = node.live
        await node.kill(sid)                            # the node ends the session
        bye = await ua.next(pred=lambda m: m.is_request)
        assert bye.method == "BYE" and bye.get("Call-ID") == "c1"
        assert M.parse_name_addr(bye.get("From")).tag == tag
        assert M.parse_name_addr(bye.get("To")).tag == "ua1"
        assert bye.uri == f"sip:ua@127.0.0.1:{ua.port}" and M.check_request(bye) is None
        ua.transport.sendto(M.make_response(bye, 200).to_bytes(), bridge.address)
        for _ in range(50):
            if any(e["event"] == "call_end" for e in events):
                break
            await asyncio.sleep(0.02)
    events = run(scenario)
    (end,) = [e for e in events if e["event"] == "call_end"]
    assert end["reason"] == "node_closed" and end["node_stats"] == {"frames_in": 0}
    (bye,) = [e for e in events if e["event"] == "bye_sent"]
    assert bye["status"] == 200


def test_bye_closes_the_node_session_and_retransmitted_bye_gets_the_same_answer():
    async def scenario(bridge, node, ua, events):
        _, tag = await establish(bridge, ua)
        await asyncio.sleep(0.3)
        branch = ua.request(bridge.address, "BYE", "c1", cseq=2, to_tag=tag)
        assert (await ua.final()).status == 200
        ua.request(bridge.address, "BYE", "c1", cseq=2, to_tag=tag, branch=branch)
        assert (await ua.final()).status == 200        # from the transaction cache
        ua.request(bridge.address, "BYE", "c1", cseq=3, to_tag=tag)
        assert (await ua.final()).status == 481         # the dialog is gone
        for _ in range(100):
            if any(e["event"] == "call_end" for e in events):
                break
            await asyncio.sleep(0.02)
        assert len(node.closes) == 1
        assert bridge.stats.retransmits_in == 1
    events = run(scenario)
    (end,) = [e for e in events if e["event"] == "call_end"]
    assert end["reason"] == "bye" and end["node_stats"]["frames_in"] >= 0


def test_cancel_while_the_node_is_opening():
    async def scenario(bridge, node, ua, events):
        branch = ua.request(bridge.address, "INVITE", "c2", body=offer(9))
        assert (await ua.next()).status == 100
        await asyncio.sleep(0.1)
        ua.request(bridge.address, "CANCEL", "c2", branch=branch)
        got = sorted([(await ua.next()).status, (await ua.next()).status,
                      (await ua.final()).status])
        assert 200 in got and 487 in got
        ua.request(bridge.address, "ACK", "c2", branch=branch)
        await asyncio.sleep(0.6)                        # the node's `opened` comes later
        assert node.closes and not node.live            # ... and the bridge closes it
        assert bridge.stats.calls_cancelled == 1 and not bridge.calls
    run(scenario, {"open_delay": 0.3})


@pytest.mark.parametrize("reason, capacity_status, status, retry_after", [
    ("capacity", 503, 503, "5"), ("capacity", 486, 486, "5"), ("draining", 503, 503, "5"),
    ("invalid", 503, 503, None)])
def test_node_refusal(reason, capacity_status, status, retry_after):
    """A node at capacity got 486 whatever the configuration; a refusal that cannot pass
    (`invalid`) must not invite the caller to try again in 5 s."""
    async def scenario(bridge, node, ua, events):
        ua.request(bridge.address, "INVITE", "c3", body=offer(9))
        final = await ua.final()
        assert final.status == status and "node refused" in final.get("Warning")
        assert final.get("Retry-After") == retry_after
        n = 0
        while n < 2:                                    # the final is resent until the ACK
            n += (await ua.next()).status == status
        ua.request(bridge.address, "ACK", "c3", to_tag=M.parse_name_addr(final.get("To")).tag)
        assert bridge.stats.calls_refused == 1 and not bridge.calls
    run(scenario, {"refuse": reason}, cfg=replace(CFG, capacity_status=capacity_status))


def test_no_node_gets_503():
    async def scenario(bridge, node, ua, events):
        await node.stop()                              # nobody answers `open`
        ua.request(bridge.address, "INVITE", "c4", body=offer(9))
        final = await ua.final(timeout=3)
        assert final.status == 503 and final.get("Retry-After") == "5"
    run(scenario, cfg=replace(CFG, open_timeout=0.3))


def test_invite_retransmission_and_200_retransmitted_until_ack_then_ack_timeout_bye():
    async def scenario(bridge, node, ua, events):
        branch = ua.request(bridge.address, "INVITE", "c5", body=offer(9))
        ok = await ua.final()
        ua.request(bridge.address, "INVITE", "c5", body=offer(9), branch=branch)
        assert (await ua.next()).status == 200          # the retransmission is answered
        oks = 0
        while True:                                     # no ACK: 200 again and again, then BYE
            msg = await ua.next(timeout=5)
            if msg.is_request:
                break
            oks += msg.status == 200
        assert msg.method == "BYE" and oks >= 3 and bridge.stats.ack_timeouts == 1
        assert M.parse_name_addr(msg.get("From")).tag == M.parse_name_addr(ok.get("To")).tag
    run(scenario, cfg=replace(CFG, t1=0.02, t2=0.05))


def test_reinvite_same_codec_ok_codec_change_488():
    async def scenario(bridge, node, ua, events):
        _, tag = await establish(bridge, ua, body=offer(9))
        ua.request(bridge.address, "INVITE", "c1", cseq=2, to_tag=tag, body=offer(11))
        ok = await ua.final()
        assert ok.status == 200 and b"RTP/AVP 0" in ok.body
        ua.request(bridge.address, "ACK", "c1", cseq=2, to_tag=tag)
        (call,) = bridge.calls
        assert call.answer.remote == ("127.0.0.1", 11)
        ua.request(bridge.address, "INVITE", "c1", cseq=3, to_tag=tag, body=offer(11, 8, "PCMA"))
        assert (await ua.final()).status == 488
        ua.request(bridge.address, "INVITE", "c1", cseq=4, to_tag="nope", body=offer(11))
        assert (await ua.final()).status == 481
    run(scenario)


def test_late_offer_answer_in_ack_and_rtp_both_ways():
    async def scenario(bridge, node, ua, events):
        loop = asyncio.get_running_loop()
        media_rx: asyncio.Queue = asyncio.Queue()

        class Media(asyncio.DatagramProtocol):
            def datagram_received(self, data, addr):
                media_rx.put_nowait(rtp.parse(data))
        media, _ = await loop.create_datagram_endpoint(Media, local_addr=("127.0.0.1", 0))
        ok, tag = await establish(bridge, ua, body=b"")          # no SDP: we offer
        assert b"RTP/AVP 0" in ok.body and b"a=rtpmap:0 PCMU/8000" in ok.body
        our_port = int(ok.body.split(b"m=audio ")[1].split()[0])
        ua.request(bridge.address, "ACK", "c1", to_tag=tag,
                   body=offer(media.get_extra_info("sockname")[1]))
        pkt = await asyncio.wait_for(media_rx.get(), 2)           # node audio comes back
        assert pkt.payload_type == 0 and len(pkt.payload) == 160 and pkt.marker
        sender = rtp.RtpSender(0)
        for i in range(10):
            media.sendto(sender.packet(b"\x42" * 160, 160), ("127.0.0.1", our_port))
            media.sendto(os.urandom(7), ("127.0.0.1", our_port))      # garbage on RTP
            await asyncio.sleep(0.02)
        (call,) = bridge.calls
        for _ in range(100):        # a loaded CI machine may take longer than 0.1 s to read them
            if call.jitter.stats.played >= 10 and call.stats.rtp_bad >= 10:
                break
            await asyncio.sleep(0.02)
        assert call.jitter.stats.played == 10 and call.stats.rtp_bad == 10
        assert node.audio_in[call.session_id] >= 1600
        media.close()
    run(scenario)


def test_request_errors():
    async def scenario(bridge, node, ua, events):
        dest = bridge.address
        ua.request(dest, "OPTIONS", "o1")
        ok = await ua.final()
        assert ok.status == 200 and "BYE" in ok.get("Allow")
        assert M.parse_name_addr(ok.get("To")).tag
        branch = ua.request(dest, "REGISTER", "r1")
        refused = await ua.final()
        # every final answer to a request whose To had no tag carries one (RFC 3261 §8.2.6.2)
        assert refused.status == 405 and M.parse_name_addr(refused.get("To")).tag
        ua.request(dest, "REGISTER", "r1", branch=branch)   # its retransmission: the same answer
        assert (await ua.final()).get("To") == refused.get("To")
        ua.request(dest, "FROBNICATE", "f1")
        unknown = await ua.final()
        assert unknown.status == 501 and M.parse_name_addr(unknown.get("To")).tag
        ua.request(dest, "INVITE", "i1", body=offer(9), extra=["Require: 100rel"])
        resp = await ua.final(call_id="i1")
        assert resp.status == 420 and resp.get("Unsupported") == "100rel"
        ua.request(dest, "INVITE", "i2", body=b"hello", ctype="text/plain")
        assert (await ua.final(call_id="i2")).status == 415
        ua.request(dest, "INVITE", "i3", body=offer(9), contact=False)
        assert (await ua.final(call_id="i3")).status == 400
        ua.request(dest, "INVITE", "i4", body=b"v=0\r\nnot sdp")
        assert (await ua.final(call_id="i4")).status == 400
        ua.request(dest, "INVITE", "i5", body=offer(9, 18, "G729"))
        resp = await ua.final(call_id="i5")
        assert resp.status == 488 and resp.get("Warning").startswith("305")
        ua.request(dest, "CANCEL", "nothing")
        gone = await ua.final(call_id="nothing")
        assert gone.status == 481 and M.parse_name_addr(gone.get("To")).tag
        ua.transport.sendto(b"INVITE sip:x SIP/3.0\r\nVia: SIP/3.0/UDP h;branch=z9hG4bK1\r\n"
                            b"From: <sip:a@b>;tag=1\r\nTo: <sip:b@c>\r\nCall-ID: v\r\n"
                            b"CSeq: 1 INVITE\r\n\r\n", dest)
        assert (await ua.final(call_id="v")).status == 505
        ua.transport.sendto(b"INVITE sip:x SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK2\r\n"
                            b"From: <sip:a@b>;tag=1\r\nTo: <sip:b@c>\r\n"
                            b"CSeq: 1 INVITE\r\n\r\n", dest)
        resp = await ua.next(pred=lambda m: not m.is_request and m.get("Call-ID") is None)
        assert resp.status == 400 and "missing Call-ID" in resp.get("Warning")
        for junk in (b"\x00" * 3, os.urandom(500), b"SIP/2.0 200 OK\r\n\r\n", b"\r\n\r\n"):
            ua.transport.sendto(junk, dest)
        ua.request(dest, "OPTIONS", "o2")
        assert (await ua.final(call_id="o2")).status == 200
        s = bridge.stats
        assert s.garbage == 2 and s.keepalives == 1 and s.stray == 1 and s.bad_requests == 3
        assert not bridge.calls and not node.opens
    run(scenario)


def test_max_calls_gives_503():
    async def scenario(bridge, node, ua, events):
        await establish(bridge, ua, "m1")
        ua.request(bridge.address, "INVITE", "m2", body=offer(9))
        final = await ua.final()
        assert final.status == 503 and final.get("Retry-After") == "5"
    run(scenario, cfg=replace(CFG, max_calls=1))


def test_shutdown_hangs_up_every_call():
    async def scenario(bridge, node, ua, events):
        await establish(bridge, ua, "s1")
        await establish(bridge, ua, "s2")
        closing = asyncio.get_running_loop().create_task(bridge.close(timeout=1.0))
        byes = set()
        while len(byes) < 2:
            bye = await ua.next(pred=lambda m: m.is_request)
            byes.add(bye.get("Call-ID"))
            ua.transport.sendto(M.make_response(bye, 200).to_bytes(), bridge.address)
        await closing
        assert sorted(node.closes) == sorted(c for c in node.audio_in) or len(node.closes) == 2
    events = run(scenario)
    ends = [e for e in events if e["event"] == "call_end"]
    assert sorted(e["call_id"] for e in ends) == ["s1", "s2"]
    assert all(e["reason"] == "shutdown" for e in ends)


def test_an_invite_burst_is_answered_without_retransmission():
    """The probe lost 134 of 300 burst INVITEs to the SIP socket's default receive buffer. Here
    300 INVITEs are queued at once (sent without yielding, so the bridge reads none of them
    before the last is sent) and each must be answered on its first and only transmission."""
    n, cfg = 300, replace(CFG, max_calls=4)

    async def scenario(bridge, node, ua, events):
        sock = bridge.transport.get_extra_info("socket")
        granted = sockbuf.granted(sock, "rcvbuf")
        if granted < cfg.sip_rcvbuf:
            # This kernel caps the buffer (net.core.rmem_max) and we may not force it: the
            # bridge must say so, and the burst itself cannot be judged here.
            assert any(e["event"] == "socket_buffer_clamped" for e in events), events[:3]
            pytest.skip(f"SIP receive buffer capped at {granted} < {cfg.sip_rcvbuf} bytes: "
                        f"raise net.core.rmem_max to run the burst")
        sockbuf.size(ua.transport.get_extra_info("socket"), "rcvbuf", 4 << 20)   # our side
        for i in range(n):
            ua.request(bridge.address, "INVITE", f"burst-{i}", body=offer(9))
        answered = set()
        while len(answered) < n:                 # 100 Trying, or 503 beyond max_calls
            try:
                msg = await ua.next(timeout=5.0, pred=lambda m: not m.is_request)
            except asyncio.TimeoutError:
                raise AssertionError(f"{n - len(answered)} of {n} INVITEs never answered "
                                     f"(SIP receive buffer: {granted} bytes)") from None
            answered.add(msg.get("Call-ID"))
        assert bridge.stats.retransmits_in == 0
        assert events[0]["event"] == "listening" and events[0]["rcvbuf"] == granted
    run(scenario, cfg=cfg)
