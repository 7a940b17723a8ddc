"""End to end, what the bridge refuses or shrugs off: sipp and raw UDP requests against the
bridge in front of the real node (sim backend).

One node (`--max-sessions 3`) and one bridge run as subprocesses on free loopback ports for the
whole module (`sipp_stack`). Broken SDP gets 400 and an SDP without G.711 488 (both through sipp).
A 4th call while 3 are up gets 503 with Retry-After from the node's refusal, the bridge logs it,
and the 3 live calls go on. A request missing Call-ID gets 400, and random bytes on the SIP port
are counted, never fatal. sipp is required: without it these tests FAIL (CI installs it:
`apt-get install sip-tester`).
"""
import os
import socket
import time

import numpy as np
import pytest

from tests.transports.sipp_stack import (ACK, HEAD, PY, SDP, Proc, _free_port, node_and_bridge,
                                         run_sipp)
from transports.sip import message as M
from transports.sip.media import rtp


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from node_and_bridge(tmp_path_factory)


@pytest.fixture
def own_bridge():
    """A bridge for one test that stops it to read its stats: stopping the module's would leave
    the tests a worker runs after it (worksteal runs them in any order) talking to nobody. Its
    node is never started: nothing the test sends reaches the node."""
    port = _free_port()
    bridge = Proc([PY, "-m", "transports.sip", "--node",
                   f"tcp://127.0.0.1:{_free_port(socket.SOCK_STREAM)}",
                   "--listen", f"127.0.0.1:{port}"], "bridge")
    try:
        bridge.wait_for(lambda: bridge.events("listening"), 30, "listening event")
        yield port, bridge
    finally:
        bridge.stop()


def capture(sock: socket.socket, until: float) -> list[tuple[float, rtp.RtpPacket]]:
    """RTP arriving on `sock` until `until`, then whatever the socket still holds."""
    out = []
    while True:
        sock.settimeout(max(0.0, until - time.monotonic()) or None)
        if sock.gettimeout() is None:
            sock.setblocking(False)
        try:
            data = sock.recv(2048)
        except (socket.timeout, BlockingIOError):
            break
        if data == b"STOP":
            break
        out.append((time.monotonic(), rtp.parse(data)))
    return out


def raw_request(port: int, method: str, call_id: str | None, body: bytes = b"",
                sock: socket.socket | None = None, to_tag: str = "", cseq: int = 1
                ) -> tuple[socket.socket, bytes]:
    """Send one request from a Python UDP socket (a bound new one unless given)."""
    if sock is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
    here = sock.getsockname()[1]
    lines = [f"{method} sip:wave@127.0.0.1:{port} SIP/2.0",
             f"Via: SIP/2.0/UDP 127.0.0.1:{here};branch=z9hG4bK{os.urandom(4).hex()};rport",
             f"From: <sip:py@127.0.0.1:{here}>;tag=py1",
             f"To: <sip:wave@127.0.0.1:{port}>" + (f";tag={to_tag}" if to_tag else ""),
             f"CSeq: {cseq} {method}", f"Contact: <sip:py@127.0.0.1:{here}>", "Max-Forwards: 70"]
    if call_id:
        lines.append(f"Call-ID: {call_id}")
    if body:
        lines.append("Content-Type: application/sdp")
    lines.append(f"Content-Length: {len(body)}")
    data = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
    sock.sendto(data, ("127.0.0.1", port))
    return sock, data


def responses(sock: socket.socket, timeout: float) -> list[M.SipMessage]:
    out, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            msg = M.parse(sock.recv(65535))
        except socket.timeout:
            break
        if msg.is_request:                      # e.g. the bridge's own BYE: not ours to count
            continue
        out.append(msg)
        if msg.status >= 200:
            break
    return out


def _python_offer(port: int) -> bytes:
    return (f"v=0\r\no=py 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
            f"m=audio {port} RTP/AVP 8\r\na=rtpmap:8 PCMA/8000\r\n").encode()


@pytest.mark.parametrize("sdp_text, status", [
    ("      v=0\n      this is not SDP\n", 400),
    (SDP.format(port=9, fmt=18, codec="G729"), 488),
])
def test_bad_offers_get_the_right_error_through_sipp(stack, sdp_text, status):
    scenario = (HEAD.format(name="bad", sdp=sdp_text)
                + f'  <recv response="{status}"/>\n' + ACK.format(offset="-1")
                + "</scenario>\n")
    proc = run_sipp(stack, scenario, 1)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.errors


@pytest.mark.slow
def test_fourth_call_is_refused_while_three_are_up(stack):
    """The node (3 slots) refuses a 4th session: the caller gets 503 Service Unavailable with
    Retry-After (a proxy fails over; 486 only when configured), and the three live calls keep
    getting the node's audio."""
    port, calls = stack["port"], []
    for i in range(4):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rx.bind(("127.0.0.1", 0))
        sock, _ = raw_request(port, "INVITE", f"busy-{i}@py", _python_offer(rx.getsockname()[1]))
        final = responses(sock, 8)[-1]
        calls.append((sock, rx, final))
        if final.status == 200:
            raw_request(port, "ACK", f"busy-{i}@py", sock=sock,
                        to_tag=M.parse_name_addr(final.get("To")).tag)
    raw_request(port, "ACK", "busy-3@py", sock=calls[3][0],
                to_tag=M.parse_name_addr(calls[3][2].get("To")).tag)
    statuses = [final.status for _, _, final in calls]
    assert statuses == [200, 200, 200, 503], statuses
    assert calls[3][2].get("Retry-After") == "5"
    bridge = stack["bridge"]
    bridge.wait_for(lambda: _refusal(bridge, "busy-3@py"), 5, "call_refused line")
    line = _refusal(bridge, "busy-3@py")
    assert (line["status"], line["reason"]) == (503, "node_capacity")
    until = time.monotonic() + 0.8                     # the live calls go on after the refusal
    caps = [capture(rx, until) for _, rx, _ in calls[:3]]
    survived = [any(p.payload != b"\xd5" * 160 for _, p in cap) for cap in caps]
    for i, (sock, _, final) in enumerate(calls[:3]):
        raw_request(port, "BYE", f"busy-{i}@py", sock=sock,
                    to_tag=M.parse_name_addr(final.get("To")).tag, cseq=2)
        assert responses(sock, 3)[-1].status in (200, 481)    # 481: the bridge hung up first
    assert all(survived), "the live calls must go on after a refusal"


def _refusal(bridge: Proc, call_id: str) -> dict | None:
    return next((e for e in bridge.events("call_refused") if e["call_id"] == call_id), None)


def test_malformed_requests_and_garbage_never_hurt(own_bridge):
    port, bridge = own_bridge
    sock, _ = raw_request(port, "INVITE", None, _python_offer(9))       # no Call-ID
    (resp,) = responses(sock, 3)
    assert resp.status == 400 and "Call-ID" in resp.get("Warning")
    junk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rng = np.random.default_rng(0)
    for n in (1, 7, 100, 1400):
        junk.sendto(rng.integers(0, 256, n, dtype=np.uint8).tobytes(), ("127.0.0.1", port))
    sock, _ = raw_request(port, "OPTIONS", "options-1@py", sock=sock)
    (resp,) = responses(sock, 3)
    assert resp.status == 200 and "INVITE" in resp.get("Allow")
    sock, _ = raw_request(port, "REGISTER", "reg-1@py", sock=sock)
    assert responses(sock, 3)[-1].status == 405
    bridge.stop()
    (stats,) = bridge.events("stats")
    assert (stats["garbage"], stats["bad_requests"]) == (4, 1), stats
    assert stats["internal_errors"] == 0
