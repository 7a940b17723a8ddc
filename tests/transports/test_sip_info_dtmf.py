"""Key presses sent as SIP INFO in the dialog (what PBXs set to `dtmfmode=info` send), beside
RFC 4733's in the RTP: the bridge in-process against the scripted fake node, the caller a real
UDP user agent on loopback."""
import asyncio

import pytest

from tests.transports.sipkit import M, establish, run
from tests.transports.test_sip_strict_rtp import until
from transports.sip.media import dtmf

RELAY = "application/dtmf-relay"


def test_info_keys_reach_the_node_once_each_and_other_bodies_are_answered_by_the_rfcs():
    async def scenario(bridge, node, ua, events):
        _, tag = await establish(bridge, ua)
        (sid,) = node.live
        answers = []
        for cseq, (ctype, body, extra) in enumerate([
                (RELAY, b"Signal=5\r\nDuration=160\r\n", ()),       # 200, key 5
                ("application/dtmf", b"#", ()),                      # 200, key #
                (RELAY, b"Signal= 10\r\nDuration=100\r\n", ()),     # 200, key * (event 10)
                ("text/plain", b"5", ()),                            # 415
                (RELAY, b"Signal=X\r\n", ()),                        # 400
                (RELAY, b"Signal=1\r\n", ("Info-Package: dtmf",)),         # 469
                ("", b"", ()),                                       # 200: a keep-alive
        ], start=2):
            ua.request(bridge.address, "INFO", "c1", cseq=cseq, to_tag=tag, body=body,
                       ctype=ctype, extra=extra)
            answers.append(await ua.final(call_id="c1"))
        assert [a.status for a in answers] == [200, 200, 200, 415, 400, 469, 200]
        assert answers[3].get("Accept") == ", ".join(dtmf.INFO_TYPES)
        assert await until(lambda: len(node.events.get(sid, [])) == 3)
        assert node.events[sid] == [("dtmf", "5"), ("dtmf", "#"), ("dtmf", "*")]
        assert bridge.stats.dtmf_keys == 3
        # outside any dialog: 481, and nothing reaches a session
        ua.request(bridge.address, "INFO", "nope", cseq=9, to_tag="x", body=b"Signal=1",
                   ctype=RELAY)
        assert (await ua.final(call_id="nope")).status == 481
        await asyncio.sleep(0.2)
        assert len(node.events[sid]) == 3
    events = run(scenario)
    keys = [e for e in events if e["event"] == "dtmf"]
    assert [(k["digit"], k["via"], k["sent_to_node"]) for k in keys] == \
        [("5", "info", True), ("#", "info", True), ("*", "info", True)]


def test_an_info_flood_is_bounded_like_rtp_keys():
    """Catches INFO keys bypassing the per-call bound: each would become a node event and a
    log line."""
    async def scenario(bridge, node, ua, events):
        _, tag = await establish(bridge, ua)
        (sid,) = node.live
        for cseq in range(2, 2 + dtmf.MAX_KEYS_PER_S + 10):
            ua.request(bridge.address, "INFO", "c1", cseq=cseq, to_tag=tag,
                       body=b"Signal=7\r\n", ctype=RELAY)
            assert (await ua.final(call_id="c1")).status == 200
        await asyncio.sleep(0.2)
        assert bridge.stats.dtmf_keys <= dtmf.MAX_KEYS_PER_S + 2
        assert len(node.events.get(sid, [])) == bridge.stats.dtmf_keys
        (call,) = bridge.calls
        assert call.dtmf.stats.suppressed >= 8
    run(scenario)


@pytest.mark.parametrize("ctype,body,digit", [
    (RELAY, b"Signal=0\r\nDuration=250\r\n", "0"), (RELAY, b"signal = 11", "#"),
    (RELAY, b"Duration=100\r\nSignal=a\r\n", "A"), ("application/dtmf", b" 9\r\n", "9"),
    ("application/dtmf", b"15", "D")])
def test_info_bodies_name_keys_by_character_or_event_number(ctype, body, digit):
    assert dtmf.info_digit(ctype, body) == digit


@pytest.mark.parametrize("body", [b"", b"Signal=", b"Signal=16", b"Signal=55", b"Duration=1",
                                  b"Signal=E"])
def test_an_info_body_naming_no_key_is_refused(body):
    with pytest.raises(dtmf.DtmfError):
        dtmf.info_digit(RELAY, body)
