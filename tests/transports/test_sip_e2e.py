"""End to end: sipp calls the bridge, the bridge talks to the real node (sim backend).

One node (`--max-sessions 3`) and one bridge run as subprocesses on free loopback ports for the
whole module. sipp places 3 concurrent calls; for each, the UDP socket of this test that its SDP
names captures the bridge's RTP and, from that socket (symmetric RTP, as phones send it: the
bridge takes media only from the SDP address, and sipp's pcap player sends from another port),
plays a generated pcap of G.711 RTP with one reordered pair, one lost and one duplicated packet;
then BYE. A 4th call while those 3 are up gets 503 with Retry-After from the node's refusal, and
the bridge logs it. Then: a caller that sends no RTP is hung up on (BYE from the bridge), broken
SDP gets 400 and an SDP without G.711 488 (both through sipp), a request missing Call-ID gets 400,
and random bytes on the SIP and RTP ports are counted, never fatal. sipp is required: without it
these tests FAIL (CI installs it: `apt-get install sip-tester`).
"""
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from transports import audio
from transports.sip import message as M
from transports.sip import pcap, rtp

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
PCAP_PACKETS = 100                      # 2 s of caller audio
SWAP, LOST, DUP = (10, 11), 30, 50      # the impairments written into the pcap


def _sipp() -> str:
    path = shutil.which("sipp")
    if path is None:
        pytest.fail("sipp is not installed: `apt-get install -y sip-tester` (.ci/run does it); "
                    "the SIP end-to-end tests need it and do not skip")
    return path


def _free_port(kind=socket.SOCK_DGRAM, even=False) -> int:
    for _ in range(50):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not even or (port % 2 == 0 and port + 2 < 65536):
            return port
    raise RuntimeError("no free port")


class Proc:
    """A subprocess whose stdout lines are collected by a thread."""

    def __init__(self, args, name):
        self.name, self.lines, self.cond = name, [], threading.Condition()
        self.p = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def events(self, kind=None):
        out = []
        for line in list(self.lines):
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and (kind is None or ev.get("event") == kind):
                out.append(ev)
        return out

    def wait_for(self, pred, timeout, what):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0 or self.p.poll() is not None:
                    raise AssertionError(f"{self.name}: no {what} within {timeout}s; output:\n"
                                         + "\n".join(self.lines[-40:]))
                self.cond.wait(min(left, 0.2))

    def stop(self, timeout=10.0):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        time.sleep(0.1)                       # let the reader thread take the last lines


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    sipp = _sipp()
    node_ep = f"tcp://127.0.0.1:{_free_port(socket.SOCK_STREAM)}"
    sip_port = _free_port()
    node = Proc([PY, "-m", "wave_actors.node", "--bind", node_ep, "--backend", "sim",
                 "--max-sessions", "3"], "node")
    bridge = None
    try:
        node.wait_for(lambda: any("listening" in ln for ln in node.lines), 30, "listening line")
        bridge = Proc([PY, "-m", "transports.sip", "--node", node_ep,
                       "--listen", f"127.0.0.1:{sip_port}", "--rtp-timeout", "2.5"], "bridge")
        bridge.wait_for(lambda: bridge.events("listening"), 30, "listening event")
        yield {"sipp": sipp, "port": sip_port, "bridge": bridge, "node": node,
               "dir": tmp_path_factory.mktemp("sipp")}
    finally:
        if bridge is not None:
            bridge.stop()
        node.stop()


def run_sipp(stack, scenario: str, calls: int, extra=(), timeout=30) -> subprocess.CompletedProcess:
    d = stack["dir"]
    name = f"sc{len(list(d.glob('*.xml')))}"
    (d / f"{name}.xml").write_text(scenario)
    args = [stack["sipp"], f"127.0.0.1:{stack['port']}", "-sf", f"{name}.xml",
            "-m", str(calls), "-l", str(calls), "-r", "20", "-i", "127.0.0.1",
            "-p", str(_free_port()), "-mi", "127.0.0.1", "-mp", str(_free_port(even=True)),
            "-trace_stat", "-stf", f"{name}.csv", "-trace_err", "-error_file", f"{name}.err",
            "-timeout", f"{timeout - 5}s", "-timeout_error", "-nostdin", *extra]
    proc = subprocess.run(args, cwd=d, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)
    proc.stats = _trace_stat(d / f"{name}.csv")
    err = d / f"{name}.err"
    proc.errors = err.read_text() if err.exists() else ""
    return proc


def _trace_stat(path: Path) -> dict:
    rows = [ln.split(";") for ln in path.read_text().splitlines() if ln.strip()]
    return dict(zip(rows[0], rows[-1]))


HEAD = """<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="{name}">
  <send retrans="500"><![CDATA[

      INVITE sip:wave@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: wave <sip:wave@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      CSeq: 1 INVITE
      Contact: sip:sipp@[local_ip]:[local_port]
      Max-Forwards: 70
      Content-Type: application/sdp
      Content-Length: [len]

{sdp}
    ]]></send>
  <recv response="100" optional="true"/>
  <recv response="180" optional="true"/>
"""
SDP = """      v=0
      o=sipp 53655765 2353687637 IN IP4 [local_ip]
      s=-
      c=IN IP4 [media_ip]
      t=0 0
      m=audio {port} RTP/AVP {fmt}
      a=rtpmap:{fmt} {codec}/8000
      a=ptime:20
"""
ACK = """  <send><![CDATA[

      ACK sip:wave@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch{offset}]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: wave <sip:wave@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 1 ACK
      Max-Forwards: 70
      Content-Length: 0

    ]]></send>
"""
BYE = """  <send retrans="500"><![CDATA[

      BYE sip:wave@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: wave <sip:wave@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 2 BYE
      Max-Forwards: 70
      Content-Length: 0

    ]]></send>
  <recv response="200" crlf="true"/>
</scenario>
"""
WAIT_BYE = """  <recv request="BYE" timeout="8000"/>
  <send><![CDATA[

      SIP/2.0 200 OK
      [last_Via:]
      [last_From:]
      [last_To:]
      [last_Call-ID:]
      [last_CSeq:]
      Content-Length: 0

    ]]></send>
</scenario>
"""


def caller_pcap(path: Path) -> None:
    """2 s of a 440 Hz tone as PCMU RTP, 20 ms apart, one pair swapped, one lost, one doubled."""
    t = np.arange(PCAP_PACKETS * 160) / 8000
    law = audio.encode((0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), "pcmu")
    pkts = [rtp.RtpPacket(0, 1000 + i, 5000 + 160 * i, 0x5EED, law[160 * i:160 * i + 160],
                          marker=i == 0).pack() for i in range(PCAP_PACKETS)]
    order = list(range(PCAP_PACKETS))
    order[SWAP[0]], order[SWAP[1]] = order[SWAP[1]], order[SWAP[0]]
    order.remove(LOST)
    order.insert(order.index(DUP) + 1, DUP)
    pcap.write(path, [(1.0 + 0.02 * k, pkts[i]) for k, i in enumerate(order)])


def converse(sock: socket.socket, pkts: list[tuple[float, bytes]], until: float
             ) -> list[tuple[float, rtp.RtpPacket]]:
    """A symmetric phone: captures the RTP arriving on `sock` until `until` (or a STOP), and
    from the bridge's first packet on sends `pkts` (at their pcap times) back to where it came
    from, out of the same socket."""
    out, peer, start, k = [], None, 0.0, 0
    while True:
        now = time.monotonic()
        if peer is not None and k < len(pkts) and now >= start + pkts[k][0]:
            sock.sendto(pkts[k][1], peer)
            k += 1
            continue
        if now >= until:
            break
        wake = until if peer is None or k == len(pkts) else min(until, start + pkts[k][0])
        sock.settimeout(max(0.001, wake - now))
        try:
            data, addr = sock.recvfrom(2048)
        except socket.timeout:
            continue
        if data == b"STOP":
            break
        if peer is None:
            peer, start = addr, time.monotonic() - pkts[0][0]
        out.append((time.monotonic(), rtp.parse(data)))
    return out


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


@pytest.mark.slow
def test_three_concurrent_calls_rtp_both_ways(stack):
    d, bridge = stack["dir"], stack["bridge"]
    caller_pcap(d / "caller.pcap")
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    (d / "ports.csv").write_text("SEQUENTIAL\n" + "".join(f"{p};\n" for p in ports))
    scenario = (HEAD.format(name="caller", sdp=SDP.format(port="[field0]", fmt=0, codec="PCMU"))
                + '  <recv response="200" rtd="true"/>\n' + ACK.format(offset="")
                + '  <pause milliseconds="3000"/>\n' + BYE)
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(
        proc=run_sipp(stack, scenario, 3, ["-inf", "ports.csv"])))
    runner.start()
    until = time.monotonic() + 8
    caps: list = [None] * 3
    pkts = pcap.read(d / "caller.pcap")
    threads = [threading.Thread(target=lambda i=i: caps.__setitem__(
        i, converse(socks[i], pkts, until)))
               for i in range(3)]
    for t in threads:
        t.start()
    runner.join(30)
    for s in socks:
        s.sendto(b"STOP", s.getsockname())
    for t in threads:
        t.join(10)
    proc = result["proc"]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.errors
    assert proc.stats["SuccessfulCall(C)"] == "3" and proc.stats["FailedCall(C)"] == "0"
    ssrcs = {_check_stream(cap) for cap in caps}
    assert len(ssrcs) == 3                                  # a random SSRC per call
    bridge.wait_for(lambda: len(bridge.events("call_end")) >= 3, 10, "3 call_end events")
    for end in bridge.events("call_end")[:3]:
        assert end["reason"] == "bye"
        node = end["node_stats"]                            # the node's `closed` stats
        assert node is not None and node["frames_in"] > 0 and node["frames_out"] > 0
        j = end["jitter"]
        assert j["reordered"] == 1 and j["lost"] == 1 and j["duplicate"] == 1, j
        assert j["played"] == PCAP_PACKETS - 1 and j["late"] == 0, j
        assert end["rtp"]["rtp_bad"] == 0 and end["rtp"]["wrong_pt"] == 0
        assert end["rtp"]["rtp_foreign"] == 0 and end["rtp_source"][1] in ports


def _check_stream(cap) -> int:
    """The bridge's RTP to one call: 20 ms G.711 packets, +1 seq, +160 ts, paced ~20 ms."""
    assert len(cap) >= 100, f"only {len(cap)} RTP packets came back"
    times, pkts = [t for t, _ in cap], [p for _, p in cap]
    assert {p.payload_type for p in pkts} == {0} and {len(p.payload) for p in pkts} == {160}
    assert len({p.ssrc for p in pkts}) == 1
    assert all((b.seq - a.seq) & 0xFFFF == 1 for a, b in zip(pkts, pkts[1:]))
    assert all((b.timestamp - a.timestamp) & 0xFFFFFFFF == 160 for a, b in zip(pkts, pkts[1:]))
    assert pkts[0].marker and not any(p.marker for p in pkts[1:])
    gaps = np.diff(times) * 1000
    assert 15 <= statistics.median(gaps) <= 25, statistics.median(gaps)
    assert abs(gaps.mean() - 20) < 2, gaps.mean()             # no drift over ~3 s
    pcm = audio.decode(b"".join(p.payload for p in pkts), "pcmu").reshape(len(pkts), 160)
    rms = np.sqrt((pcm ** 2).mean(axis=1))
    assert (rms > 0.05).mean() > 0.25, "the node's tone should come back"
    return pkts[0].ssrc


def _python_offer(port: int) -> bytes:
    return (f"v=0\r\no=py 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
            f"m=audio {port} RTP/AVP 8\r\na=rtpmap:8 PCMA/8000\r\n").encode()


@pytest.mark.slow
def test_silent_caller_is_hung_up_on(stack):
    bridge = stack["bridge"]
    ended = len(bridge.events("call_end"))
    scenario = (HEAD.format(name="silent", sdp=SDP.format(port=9, fmt=8, codec="PCMA"))
                + '  <recv response="200"/>\n' + ACK.format(offset="") + WAIT_BYE)
    proc = run_sipp(stack, scenario, 1)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.errors
    bridge.wait_for(lambda: len(bridge.events("call_end")) > ended, 10, "call_end")
    end = bridge.events("call_end")[-1]
    assert end["reason"] == "rtp_timeout" and end["codec"] == "PCMA"
    assert end["node_stats"] is not None and end["rtp"]["silence_fill"] > 0


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


def test_malformed_requests_and_garbage_never_hurt(stack):
    port, bridge = stack["port"], stack["bridge"]
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
    # at least what this test sent (the bridge is the module's: how many other tests ran on
    # it depends on how the workers split the module)
    assert stats["garbage"] >= 4 and stats["bad_requests"] >= 1
    assert stats["internal_errors"] == 0
