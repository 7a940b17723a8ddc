"""SIP message parse/serialise (RFC 3261) and SDP offer/answer (RFC 4566/3264)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transports.sip import message as M
from transports.sip import sdp

INVITE = (
    "INVITE sip:wave@127.0.0.1:5060 SIP/2.0\r\n"
    "Via: SIP/2.0/UDP 10.0.0.1:5070;branch=z9hG4bK776asdhds;rport\r\n"
    "Max-Forwards: 70\r\n"
    "To: Wave <sip:wave@127.0.0.1>\r\n"
    "From: \"Alice, A.\" <sip:alice@10.0.0.1>;tag=1928301774\r\n"
    "Call-ID: a84b4c76e66710@pc33\r\n"
    "CSeq: 314159 INVITE\r\n"
    "Contact: <sip:alice@10.0.0.1:5070>\r\n"
    "Content-Type: application/sdp\r\n"
    "Content-Length: {n}\r\n\r\n{body}")
OFFER = ("v=0\r\no=alice 2890844526 2890844526 IN IP4 10.0.0.1\r\ns=-\r\n"
         "c=IN IP4 10.0.0.1\r\nt=0 0\r\nm=audio 49170 RTP/AVP 8 0 101\r\n"
         "a=rtpmap:8 PCMA/8000\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:101 telephone-event/8000\r\n"
         "a=ptime:20\r\na=sendrecv\r\n")


def invite(body: str = OFFER) -> bytes:
    return INVITE.format(n=len(body.encode()), body=body).encode()


def test_parse_invite():
    msg = M.parse(invite())
    assert msg.is_request and msg.method == "INVITE" and msg.uri == "sip:wave@127.0.0.1:5060"
    assert msg.get("call-id") == msg.get("i") == "a84b4c76e66710@pc33"
    assert M.parse_cseq(msg.get("CSeq")) == (314159, "INVITE")
    assert M.parse_name_addr(msg.get("From")).tag == "1928301774"
    assert M.parse_name_addr(msg.get("From")).display == "Alice, A."
    assert M.parse_name_addr(msg.get("To")).tag is None
    via = M.parse_via(msg.get("Via"))
    assert (via.transport, via.host, via.port, via.params["branch"]) == \
        ("UDP", "10.0.0.1", 5070, "z9hG4bK776asdhds")
    assert msg.body == OFFER.encode()
    assert M.check_request(msg) is None
    assert M.parse(msg.to_bytes()).to_bytes() == msg.to_bytes() == invite()


def test_compact_forms_folding_and_lf_only():
    raw = (b"OPTIONS sip:wave@h SIP/2.0\n"
           b"v: SIP/2.0/UDP h:1;branch=z9hG4bKx\n"
           b"f: <sip:a@h>;tag=1\nt: <sip:b@h>\ni: abc\n"
           b"CSeq: 1\n  OPTIONS\nl: 0\n\n")
    msg = M.parse(raw)
    assert msg.get("Call-ID") == "abc" and msg.get("Content-Length") == "0"
    assert msg.get("CSeq") == "1 OPTIONS"
    assert M.check_request(msg) is None


def test_body_truncated_to_content_length_and_short_body_is_an_error():
    raw = invite()
    msg = M.parse(raw + b"trailing junk")
    assert msg.body == OFFER.encode()
    with pytest.raises(M.SipParseError) as err:
        M.parse(raw[:-10])
    assert err.value.partial is not None and err.value.partial.method == "INVITE"


@pytest.mark.parametrize("raw, answerable", [
    (b"\x00\x01garbage", False),
    (b"HELLO WORLD\r\n\r\n", False),
    (b"INVITE sip:x@y SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\nBad Header Line\r\n\r\n",
     True),
    (b"INVITE sip:x@y SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\nContent-Length: x\r\n\r\n",
     True),
    (b"INVITE sip:x@y SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\nFrom: \xff\r\n\r\n", True),
])
def test_parse_errors_keep_the_partial_request(raw, answerable):
    with pytest.raises(M.SipParseError) as err:
        M.parse(raw)
    assert (err.value.partial is not None and err.value.partial.get("Via") is not None) == \
        answerable


@pytest.mark.parametrize("drop, reason", [("Call-ID", "missing Call-ID"),
                                          ("CSeq", "missing CSeq"), ("From", "missing From")])
def test_check_request_missing_headers(drop, reason):
    msg = M.parse(invite())
    msg.headers = [(k, v) for k, v in msg.headers if k != drop]
    assert M.check_request(msg) == reason


def test_check_request_cseq_method_mismatch():
    msg = M.parse(invite())
    msg.set("CSeq", "1 BYE")
    assert "does not match" in M.check_request(msg)


def test_make_response_copies_headers_adds_tag_and_rport():
    req = M.parse(invite())
    resp = M.make_response(req, 180, to_tag="abc", source=("192.0.2.1", 4000))
    assert resp.start_line() == "SIP/2.0 180 Ringing"
    via = M.parse_via(resp.get("Via"))
    assert via.params["received"] == "192.0.2.1" and via.params["rport"] == "4000"
    assert M.parse_name_addr(resp.get("To")).tag == "abc"
    for name in ("From", "Call-ID", "CSeq"):
        assert resp.get(name) == req.get(name)
    trying = M.make_response(req, 100, to_tag="abc")
    assert M.parse_name_addr(trying.get("To")).tag is None     # no tag on 100 (§8.2.6.2)
    back = M.parse(resp.to_bytes())
    assert back.status == 180 and back.get("Content-Length") == "0"


def test_split_commas_respects_quotes_and_brackets():
    assert M.split_commas('"a, b" <sip:x@y;p=1,2>, sip:z@w') == \
        ['"a, b" <sip:x@y;p=1,2>', "sip:z@w"]


# --------------------------------------------------------------------------- properties

_token = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.!%*_+`'~",
                 min_size=1, max_size=12)
_value = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x2FF,
                               blacklist_characters="\x7f"), min_size=1, max_size=30)


@st.composite
def messages(draw):
    if draw(st.booleans()):
        msg = M.SipMessage(method=draw(_token).upper(), uri="sip:" + draw(_token) + "@h")
    else:
        msg = M.SipMessage(status=draw(st.integers(100, 699)),
                           reason=draw(st.text("abc XYZ", max_size=20)).strip() or "X")
    names = st.sampled_from(["Via", "From", "To", "Call-ID", "CSeq", "X-Custom", "Subject"])
    for name, value in draw(st.lists(st.tuples(names, _value), max_size=8)):
        msg.add(name, value)
    msg.body = draw(st.binary(max_size=64))
    return msg


@settings(max_examples=200, deadline=None)
@given(messages())
def test_roundtrip_property(msg):
    data = msg.to_bytes()
    back = M.parse(data)
    assert back.to_bytes() == data
    assert back.body == msg.body
    assert (back.method, back.uri, back.status) == (msg.method, msg.uri, msg.status)
    assert [h for h in back.headers if h[0] != "Content-Length"] == msg.headers


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_never_raise_anything_but_parse_error(data):
    try:
        msg = M.parse(data)
    except M.SipParseError:
        return
    if msg.is_request:
        M.check_request(msg)          # must not raise either


@settings(max_examples=200, deadline=None)
@given(st.integers(0, len(invite()) - 1), st.binary(min_size=1, max_size=4))
def test_mutated_invite_never_crashes(pos, junk):
    raw = invite()
    data = raw[:pos] + junk + raw[pos + len(junk):]
    try:
        msg = M.parse(data)
    except M.SipParseError:
        return
    M.check_request(msg)


# --------------------------------------------------------------------------- SDP


def test_sdp_roundtrip_and_negotiation_prefers_offer_order():
    offer = sdp.parse(OFFER.encode())
    assert sdp.parse(offer.to_bytes()).to_bytes() == offer.to_bytes()
    ans = sdp.negotiate(offer, "127.0.0.1", 40000, 7, 1)
    assert ans.codec.name == "PCMA" and ans.codec.pt == 8 and ans.remote == ("10.0.0.1", 49170)
    assert ans.direction == "sendrecv" and ans.we_send and ans.peer_sends
    text = ans.sdp.to_bytes().decode()
    assert "m=audio 40000 RTP/AVP 8 101\r\n" in text and "a=rtpmap:8 PCMA/8000" in text
    assert "a=ptime:20" in text and "c=IN IP4 127.0.0.1" in text
    again = sdp.parse(ans.sdp.to_bytes())
    assert len(again.media) == 1


def test_sdp_static_payload_without_rtpmap_and_direction_mirror():
    body = OFFER.replace("m=audio 49170 RTP/AVP 8 0 101", "m=audio 49170 RTP/AVP 18 0") \
        .replace("a=rtpmap:8 PCMA/8000\r\n", "").replace("a=rtpmap:0 PCMU/8000\r\n", "") \
        .replace("a=sendrecv", "a=sendonly")
    ans = sdp.negotiate(sdp.parse(body.encode()), "127.0.0.1", 40000, 7, 1)
    assert ans.codec.name == "PCMU" and ans.direction == "recvonly"
    assert not ans.we_send and ans.peer_sends


def test_sdp_rejects_other_streams_with_port_zero():
    body = OFFER + "m=video 49172 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n"
    ans = sdp.negotiate(sdp.parse(body.encode()), "127.0.0.1", 40000, 7, 1)
    assert [(m.media, m.port) for m in ans.sdp.media] == [("audio", 40000), ("video", 0)]


@pytest.mark.parametrize("body", [
    OFFER.replace("m=audio 49170 RTP/AVP 8 0 101", "m=audio 49170 RTP/AVP 18")
    .replace("a=rtpmap:8 PCMA/8000\r\na=rtpmap:0 PCMU/8000\r\n", "a=rtpmap:18 G729/8000\r\n"),
    OFFER.replace("RTP/AVP", "RTP/SAVP"),
    OFFER.replace("m=audio 49170", "m=audio 0"),
    OFFER.replace("a=rtpmap:8 PCMA/8000", "a=rtpmap:8 PCMA/16000")
    .replace("8 0 101", "8 101"),
])
def test_sdp_not_acceptable(body):
    with pytest.raises(sdp.NotAcceptable):
        sdp.negotiate(sdp.parse(body.encode()), "127.0.0.1", 40000, 7, 1)


@pytest.mark.parametrize("body", [
    b"this is not sdp", b"v=1\r\n", OFFER.replace("s=-\r\n", "").encode(),
    OFFER.replace("c=IN IP4 10.0.0.1", "c=IN IP4 not-an-ip").encode(),
    OFFER.replace("m=audio 49170", "m=audio 99999").encode(), b"v=0\r\nX=1\r\n", b"\xff\xfe",
])
def test_sdp_broken(body):
    with pytest.raises(sdp.SdpError):
        sdp.negotiate(sdp.parse(body), "127.0.0.1", 40000, 7, 1)


def test_sdp_hold_address_means_no_sending():
    body = OFFER.replace("c=IN IP4 10.0.0.1", "c=IN IP4 0.0.0.0")
    ans = sdp.negotiate(sdp.parse(body.encode()), "127.0.0.1", 40000, 7, 1)
    assert ans.remote is None and not ans.we_send


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_sdp_random_bytes_raise_only_sdp_errors(data):
    try:
        sdp.negotiate(sdp.parse(b"v=0\r\n" + data), "127.0.0.1", 1, 1, 1)
    except (sdp.SdpError, sdp.NotAcceptable):
        pass
