"""RFC 4733 DTMF at the bridge: telephone-event in the SDP answer (under the offerer's payload
type, and only when offered), and key presses in the caller's RTP reported once each to the
event log and the stats, never taken for bad RTP, lost audio or something to play to the node.
Event packets are built byte by byte from the RFC's layout here (not with the code under test),
and sipp's captures of a real sender are replayed; the calls run over real UDP sockets on
loopback with the scripted fake node, and sipp checks the answer from its side.
"""
import asyncio
import struct
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.transports.sipkit import CFG, establish, run
from tests.transports.sipp_stack import ACK, BYE, HEAD
from tests.transports.test_sip_refusals import run_sipp
from tests.transports.test_sip_strict_rtp import Media, call_end, hang_up, rtp_dest, until
from transports.sip import sdp
from transports.sip.media import dtmf, pcap, rtp

VOICE = b"\x42" * 160                  # PCMU: a byte no event payload below contains
CAPTURES = Path("/usr/share/sip-tester")   # sipp's RFC 2833 captures (package sip-tester)


def event_payload(event: int, end: bool, volume: int, duration: int) -> bytes:
    """RFC 4733 §2.3: event (8) | E (1) R (1) volume (6) | duration (16), network order."""
    return struct.pack("!BBH", event, (0x80 if end else 0) | volume, duration)


def event_offer(port: int, pt: int | None = 101, codecs="0", rate=8000) -> bytes:
    formats = codecs + ("" if pt is None else f" {pt}")
    lines = [f"m=audio {port} RTP/AVP {formats}", "a=rtpmap:0 PCMU/8000"]
    if pt is not None:
        lines += [f"a=rtpmap:{pt} telephone-event/{rate}", f"a=fmtp:{pt} 0-16"]
    return ("v=0\r\no=ua 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
            + "\r\n".join(lines) + "\r\n").encode()


class Phone:
    """A caller's RTP stream: audio and key presses share its sequence numbers and clock, as
    RFC 4733 §2.5.1.2 has them."""

    def __init__(self, event_pt=101, ssrc=0x1234ABCD):
        self.event_pt, self.ssrc = event_pt, ssrc
        self.seq, self.ts = 500, 80000

    def _packet(self, pt, payload, ts, marker=False, seq=None) -> bytes:
        seq = self.seq if seq is None else seq
        if seq == self.seq:
            self.seq += 1
        return rtp.RtpPacket(pt, seq, ts, self.ssrc, payload, marker).pack()

    def audio(self) -> bytes:
        pkt = self._packet(0, VOICE, self.ts)
        self.ts += 160
        return pkt

    def key(self, event: int, same_seq_ends=False) -> list[bytes]:
        """One press, 100 ms, as a sender does it: a zero-duration start with the marker bit,
        updates every 20 ms, the final (E) packet three times, under new sequence numbers or,
        like older senders, under one."""
        start, out = self.ts, []
        out.append(self._packet(self.event_pt, event_payload(event, False, 10, 0), start, True))
        for duration in (160, 320, 480, 640):
            out.append(self._packet(self.event_pt, event_payload(event, False, 10, duration),
                                    start))
        end_seq = self.seq
        for i in range(3):
            seq = end_seq if same_seq_ends else None
            out.append(self._packet(self.event_pt, event_payload(event, True, 10, 800), start,
                                    seq=seq))
        if same_seq_ends:
            self.seq = end_seq + 1
        self.ts += 800
        return out


# ---------------------------------------------------------------------------- the receiver


def _pkt(payload, ts=1000, ssrc=7, seq=0) -> rtp.RtpPacket:
    return rtp.RtpPacket(101, seq, ts, ssrc, payload)


def digits(rx: dtmf.DtmfReceiver, payload: bytes, ts: int) -> list[str]:
    return [k.digit for k in rx.push(_pkt(payload, ts=ts), 0.0)]


def test_receiver_reports_each_press_once():
    """The same press arrives in many packets (a zero-duration start, updates, three end
    packets): reporting per packet gave one key per packet; reporting per end packet gave
    three. Two presses of the same key are two reports (their timestamps differ)."""
    rx, keys = dtmf.DtmfReceiver(), []
    phone = Phone()
    for data in phone.key(5) + phone.key(5, same_seq_ends=True) + phone.key(11):
        keys += rx.push(rtp.parse(data), 0.0)
    assert [k.digit for k in keys] == ["5", "5", "#"]
    assert [k.timestamp for k in keys] == [80000, 80800, 81600]
    assert all(k.volume == 10 and k.duration == 160 and not k.end for k in keys)
    assert rx.stats.keys == 3 and rx.stats.packets == 24


def test_receiver_ignores_a_late_update_and_reports_an_end_only_press():
    """A reordered update of an earlier key must not report it again; a press whose only
    surviving packets are its end packets is still a press."""
    rx = dtmf.DtmfReceiver()
    assert digits(rx, event_payload(1, False, 10, 160), 1000) == ["1"]
    assert digits(rx, event_payload(2, False, 10, 160), 2000) == ["2"]
    assert digits(rx, event_payload(1, False, 10, 320), 1000) == []          # late
    (key,) = rx.push(_pkt(event_payload(3, True, 7, 800), ts=3000), 0.0)
    assert (key.digit, key.end, key.volume, key.duration) == ("3", True, 7, 800)
    assert digits(rx, event_payload(3, True, 7, 800), 3000) == []            # repeated end
    assert digits(rx, event_payload(3, False, 7, 0), 4000) == []     # zero: nothing yet
    assert rx.stats.keys == 3


def test_receiver_packed_events_and_a_key_held_past_one_segment():
    """RFC 4733 §2.5.1.5: events packed in one packet start one after another (two keys, not
    one); §2.5.1.3: a key held past 0xFFFF units goes on in a new segment (one key, not two).
    Events that are not keys 0-15 (here 16, flash) are counted, never reported."""
    rx = dtmf.DtmfReceiver()
    packed = event_payload(4, True, 10, 800) + event_payload(4, True, 10, 800)
    assert [(k.digit, k.timestamp) for k in rx.push(_pkt(packed, ts=1000), 0.0)] == \
        [("4", 1000), ("4", 1800)]
    assert digits(rx, event_payload(9, False, 10, 0xFFFF), 5000) == ["9"]
    assert digits(rx, event_payload(9, False, 10, 800), 5000 + 0xFFFF) == []
    assert digits(rx, event_payload(9, True, 10, 1600), 5000 + 0xFFFF) == []
    assert digits(rx, event_payload(16, True, 10, 800), 90000) == []
    assert rx.stats.keys == 3 and rx.stats.other_events == 1


def test_receiver_bounds_reports_a_second():
    """Every report is a log line and the sender picks the timestamps: a source sending event
    packets with ever new timestamps turned each packet into a line. Past 20 a second the
    presses are counted, not reported; the budget comes back with time."""
    rx = dtmf.DtmfReceiver()
    flood = [rx.push(_pkt(event_payload(1, True, 10, 800), ts=1000 * i), 0.0) for i in range(50)]
    assert sum(len(k) for k in flood) == dtmf.MAX_KEYS_PER_S
    assert rx.stats.suppressed == 50 - dtmf.MAX_KEYS_PER_S
    assert len(rx.push(_pkt(event_payload(2, True, 10, 800), ts=99000), 0.5)) == 1
    assert rx.stats.keys == dtmf.MAX_KEYS_PER_S + 1


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_random_payloads_raise_only_dtmf_error(data):
    """Whatever a fuzzer puts in an event packet, the receiver raises DtmfError or reports
    keys: anything else would count the packet as an internal error of the call."""
    rx = dtmf.DtmfReceiver()
    try:
        keys = rx.push(_pkt(data), 0.0)
    except dtmf.DtmfError:
        assert not data or len(data) % 4
        return
    assert len(keys) <= len(data) // 4


# ---------------------------------------------------------------------------- SDP


@pytest.mark.parametrize("pt", [96, 101, 127])
def test_answer_has_telephone_event_under_the_offerers_payload_type(pt):
    """The answer must reuse the offer's number (RFC 3264 §6.1): answering 101 to an offer of
    96 makes the phone send keys under a number the bridge does not expect."""
    ans = sdp.negotiate(sdp.parse(event_offer(4000, pt)), "127.0.0.1", 40000, 7, 1)
    text = ans.sdp.to_bytes().decode()
    assert f"m=audio 40000 RTP/AVP 0 {pt}\r\n" in text and ans.event_pt == pt
    assert f"a=rtpmap:{pt} telephone-event/8000\r\n" in text
    assert f"a=fmtp:{pt} 0-15\r\n" in text


@pytest.mark.parametrize("body, events", [
    (event_offer(4000, None), True),                     # not offered
    (event_offer(4000, 101, rate=16000), True),          # not at the codec's clock rate
    (event_offer(4000, 101), False),                     # offered, but switched off
])
def test_answer_has_no_telephone_event_unless_offered_and_wanted(body, events):
    """An answer that lists telephone-event the offer lacks, or at a clock rate other than the
    audio's (events share the audio's timestamps), agrees on keys the phone will not send as
    agreed; an operator who switched events off gets none."""
    ans = sdp.negotiate(sdp.parse(body), "127.0.0.1", 40000, 7, 1, events=events)
    assert ans.event_pt is None and b"telephone-event" not in ans.sdp.to_bytes()
    assert ans.sdp.media[0].formats == ["0"]


def test_our_own_offer_carries_telephone_event():
    """A caller who sent no SDP answers our offer: without telephone-event in it, keys could
    never be agreed on such calls."""
    text = sdp.offer("127.0.0.1", 40000, 7, codecs=(sdp.PCMU,)).to_bytes().decode()
    assert "m=audio 40000 RTP/AVP 0 101\r\n" in text
    assert "a=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-15\r\n" in text
    plain = sdp.offer("127.0.0.1", 40000, 7, codecs=(sdp.PCMU,), events=False).to_bytes()
    assert b"telephone-event" not in plain


def test_invite_with_and_without_telephone_event_through_the_bridge():
    """What a phone gets in the 200 OK: telephone-event under its own payload type when it
    offered it, nothing when it did not."""
    async def scenario(bridge, node, ua, events):
        ok, _ = await establish(bridge, ua, "with", body=event_offer(9, 96))
        assert b"RTP/AVP 0 96\r\n" in ok.body and b"a=rtpmap:96 telephone-event/8000" in ok.body
        assert b"a=fmtp:96 0-15\r\n" in ok.body
        ok, _ = await establish(bridge, ua, "without", body=event_offer(9, None))
        assert b"RTP/AVP 0\r\n" in ok.body and b"telephone-event" not in ok.body
        assert {c.sip_call_id: c.event_pt for c in bridge.calls} == {"with": 96, "without": None}
    run(scenario)


# ---------------------------------------------------------------------------- RTP


def keys_logged(events) -> list[str]:
    return [e["digit"] for e in events if e["event"] == "dtmf"]


async def talk(caller: Media, dest, packets: list[bytes]) -> None:
    for data in packets:
        caller.send(data, dest)
        await asyncio.sleep(0.005)


def test_keys_reach_the_log_once_and_are_neither_garbage_nor_audio():
    """Event packets were counted as `wrong_pt` (dropped unread) and the numbers they held
    made the jitter buffer wait for, then conceal, audio that was never lost. Each press must
    be one `dtmf` line, one count and one `event` to the node; nothing of it may reach the
    node as audio."""
    async def scenario(bridge, node, ua, events):
        caller, phone = await Media.open(), Phone(event_pt=96)
        ok, tag = await establish(bridge, ua, body=event_offer(caller.port, 96))
        dest, (call,) = rtp_dest(ok), bridge.calls
        packets = [phone.audio() for _ in range(5)] + phone.key(1)
        packets += [phone.audio() for _ in range(5)] + phone.key(1, same_seq_ends=True)
        packets += [phone.audio() for _ in range(5)] + phone.key(11)
        packets += [phone.audio() for _ in range(5)]
        await talk(caller, dest, packets)
        assert await until(lambda: call.jitter.stats.played == 20), call.jitter.stats
        assert keys_logged(events) == ["1", "1", "#"]
        (line, *_) = [e for e in events if e["event"] == "dtmf"]
        assert (line["call_id"], line["session"], line["code"]) == ("c1", call.session_id, 1)
        assert line["rtp_timestamp"] == 80000 + 5 * 160 and line["dbm0"] == -10
        assert bridge.stats.dtmf_keys == 3 and call.dtmf.stats.keys == 3
        assert call.stats.wrong_pt == 0 and call.stats.rtp_bad == 0
        j = call.jitter.stats
        assert (j.lost, j.duplicate, j.events, j.repeated) == (0, 0, 22, 2), j
        # played is not yet heard: the last packets may still be on their way to the node
        def voice() -> int:
            return bytes(node.audio.get(call.session_id, b"")).count(VOICE[0])
        assert await until(lambda: voice() == 20 * 160), voice()
        heard = bytes(node.audio.get(call.session_id, b""))
        assert set(heard) <= {VOICE[0], sdp.PCMU.silence}, "event bytes reached the node"
        # each key reached the model's session once, as an event
        assert await until(lambda: len(node.events.get(call.session_id, [])) == 3)
        assert node.events[call.session_id] == [("dtmf", "1"), ("dtmf", "1"), ("dtmf", "#")]
        assert all(e["sent_to_node"] for e in events if e["event"] == "dtmf")
        await hang_up(bridge, ua, events, tag)
    end = call_end(run(scenario))
    assert end["dtmf"] == {"packets": 24, "keys": 3, "other_events": 0, "suppressed": 0}


def test_a_real_senders_captured_keys_are_each_reported_once():
    """sipp's captures of a real RFC 2833 sender (1, *, #: a zero-duration start, seven
    updates, the end packet three times under one sequence number), replayed from the
    caller's socket: one line per key."""
    names = ["1", "star", "pound"]
    paths = [CAPTURES / f"dtmf_2833_{n}.pcap" for n in names]
    if not all(p.exists() for p in paths):
        pytest.fail(f"sipp's captures are missing from {CAPTURES}: `apt-get install sip-tester`")

    async def scenario(bridge, node, ua, events):
        caller = await Media.open()
        ok, tag = await establish(bridge, ua, body=event_offer(caller.port, 101))
        dest, (call,) = rtp_dest(ok), bridge.calls
        await talk(caller, dest, [data for p in paths for _, data in pcap.read(p)])
        assert await until(lambda: len(keys_logged(events)) >= 3)
        await asyncio.sleep(0.1)                        # nothing more may come
        assert keys_logged(events) == ["1", "*", "#"]
        assert call.stats.wrong_pt == 0 and call.stats.rtp_bad == 0
        assert call.dtmf.stats.packets == 30
        await hang_up(bridge, ua, events, tag)
    run(scenario)


def test_late_offer_keys_agreed_in_the_ack_are_reported():
    """An INVITE without SDP gets our offer, telephone-event 101 in it; when the caller's answer
    in the ACK agrees, its keys must be read, not dropped as a payload type never agreed."""
    async def scenario(bridge, node, ua, events):
        caller, phone = await Media.open(), Phone(event_pt=101)
        ok, tag = await establish(bridge, ua, body=b"")           # no SDP: we offer
        assert b"a=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-15" in ok.body
        ua.request(bridge.address, "ACK", "c1", to_tag=tag, body=event_offer(caller.port, 101))
        (call,) = bridge.calls
        assert await until(lambda: call.event_pt == 101)
        await talk(caller, rtp_dest(ok), [phone.audio()] + phone.key(9))
        assert await until(lambda: keys_logged(events) == ["9"]), call.stats
        assert call.stats.wrong_pt == 0
        await hang_up(bridge, ua, events, tag)
    run(scenario)


def test_events_are_wrong_payload_when_not_agreed():
    """Keys the answer did not agree on (events switched off) stay unread and are counted as
    a payload type we did not negotiate, as before."""
    async def scenario(bridge, node, ua, events):
        caller, phone = await Media.open(), Phone()
        ok, tag = await establish(bridge, ua, body=event_offer(caller.port, 101))
        assert b"telephone-event" not in ok.body
        dest, (call,) = rtp_dest(ok), bridge.calls
        await talk(caller, dest, [phone.audio()] + phone.key(7))
        assert await until(lambda: call.stats.wrong_pt == 8), call.stats
        assert keys_logged(events) == [] and bridge.stats.dtmf_keys == 0
        await hang_up(bridge, ua, events, tag)
    run(scenario, cfg=replace(CFG, telephone_event=False))


SIPP_SDP = """      v=0
      o=sipp 53655765 2353687637 IN IP4 [local_ip]
      s=-
      c=IN IP4 [media_ip]
      t=0 0
      m=audio [media_port] RTP/AVP 0 101
      a=rtpmap:0 PCMU/8000
      a=rtpmap:101 telephone-event/8000
      a=fmtp:101 0-16
      a=ptime:20
"""
# sipp fails the call unless the 200 OK's SDP agrees on telephone-event 101 with keys 0-15
SIPP_CALL = (HEAD.format(name="dtmf-offer", sdp=SIPP_SDP) + """  <recv response="200">
    <action>
      <ereg regexp="m=audio [0-9]+ RTP/AVP 0 101" search_in="body" check_it="true"
            assign_to="mline"/>
      <ereg regexp="a=fmtp:101 0-15" search_in="body" check_it="true" assign_to="fmtp"/>
    </action>
  </recv>
""" + ACK.format(offset="") + '  <pause milliseconds="200"/>\n' + BYE.replace(
    "</scenario>", '<Reference variables="mline,fmtp"/>\n</scenario>'))


def test_sipp_offer_with_telephone_event_gets_it_answered(tmp_path):
    """sipp, a SIP stack not ours, offers telephone-event 101 (keys 0-16) and checks the
    answer agrees on 101 with the keys 0-15 we receive."""
    async def scenario(bridge, node, ua, events):
        code, out = await run_sipp(bridge, SIPP_CALL, tmp_path)
        assert code == 0, out
        assert await until(lambda: any(e["event"] == "call_end" for e in events))
    run(scenario, timeout=30)
