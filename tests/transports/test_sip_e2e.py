"""End to end: sipp calls the bridge, the bridge talks to the real node (sim backend), media
flows both ways.

One node (`--max-sessions 3`) and one bridge run as subprocesses on free loopback ports for the
whole module (`sipp_stack`). sipp places 3 concurrent calls; for each, the UDP socket of this test
that its SDP names captures the bridge's RTP and, from that socket (symmetric RTP, as phones
send it: the bridge takes media only from the SDP address, and sipp's pcap player sends from
another port), plays a generated pcap of G.711 RTP with one reordered pair, one lost and one
duplicated packet; then BYE. Then a caller that sends no RTP is hung up on (BYE from the
bridge). What the bridge refuses or shrugs off end to end is `test_sip_e2e_refusals.py`'s.
sipp is required: without it these tests FAIL (CI installs it: `apt-get install sip-tester`).
"""
import socket
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.transports.sipp_stack import ACK, BYE, HEAD, SDP, WAIT_BYE, node_and_bridge, run_sipp
from transports import audio
from transports.sip.media import pcap, rtp

PCAP_PACKETS = 100                      # 2 s of caller audio
SWAP, LOST, DUP = (10, 11), 30, 50      # the impairments written into the pcap


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from node_and_bridge(tmp_path_factory)


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


@pytest.mark.slow
def test_calls_over_tcp_one_ended_by_the_caller_one_by_us(stack):
    """sipp on one TCP connection (`-t t1`, RFC 3261 §18): a call it ends with BYE, and a
    silent one the bridge hangs up on, its BYE on that connection."""
    bridge = stack["bridge"]
    ended = len(bridge.events("call_end"))
    sdp = SDP.format(port=9, fmt=0, codec="PCMU")
    talk = (HEAD.format(name="tcp-bye", sdp=sdp) + '  <recv response="200"/>\n'
            + ACK.format(offset="") + '  <pause milliseconds="1000"/>\n' + BYE)
    silent = (HEAD.format(name="tcp-wait", sdp=sdp) + '  <recv response="200"/>\n'
              + ACK.format(offset="") + WAIT_BYE)
    for scenario, reason in ((talk, "bye"), (silent, "rtp_timeout")):
        proc = run_sipp(stack, scenario, 1, extra=("-t", "t1"))
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.errors
        assert proc.stats["SuccessfulCall(C)"] == "1"
        bridge.wait_for(lambda: len(bridge.events("call_end")) > ended, 10, "call_end")
        assert bridge.events("call_end")[-1]["reason"] == reason
        ended += 1
    assert bridge.events("bye_sent")[-1]["status"] == 200
