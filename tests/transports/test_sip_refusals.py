"""Refused calls at the bridge, over real UDP sockets on loopback with the scripted fake node:
capacity answers 503 with the configured Retry-After (486 when configured), every refusal of a
new call leaves one `call_refused` line in the event log and a count whatever refused it, the
CLI flags that choose status and Retry-After are validated, the SIP and RTP sockets get their
burst-sized buffers, and sipp (a SIP stack not ours) reads the 503 and its Retry-After.
"""
import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from tests.transports.sipkit import CFG, M, establish, offer, run
from tests.transports.sipp_stack import ACK, HEAD, SDP, _free_port, _sipp
from transports.sip import sockbuf
from transports.sip.__main__ import parse_args
from transports.sip.config import BridgeConfig


def refusals(events) -> list[dict]:
    return [e for e in events if e["event"] == "call_refused"]


async def refused(bridge, ua, call_id, status):
    """The final of a refused INVITE, ACKed: checks its status and the To tag RFC 3261
    §8.2.6.2 asks of every final response."""
    final = await ua.final(call_id=call_id)
    assert final.status == status, final.start_line()
    tag = M.parse_name_addr(final.get("To")).tag
    assert tag, "a final response without a To tag"
    ua.request(bridge.address, "ACK", call_id, to_tag=tag)
    return final


@pytest.mark.parametrize("capacity_status, retry_after, header", [
    (503, 17, "17"), (486, 17, "17"), (503, 0, None)])
def test_at_capacity_the_configured_status_and_retry_after(capacity_status, retry_after,
                                                           header):
    """At max_calls the bridge sent 503 with a fixed `Retry-After: 5` whatever was configured,
    sent it once without a To tag (no INVITE server transaction: not resent until the ACK, a
    retransmitted INVITE refused and counted again), and logged nothing."""
    cfg = replace(CFG, max_calls=1, capacity_status=capacity_status, retry_after=retry_after)

    async def scenario(bridge, node, ua, events):
        await establish(bridge, ua, "m1")
        branch = ua.request(bridge.address, "INVITE", "m2", body=offer(9))
        final = await ua.final(call_id="m2")
        assert final.status == capacity_status and final.get("Retry-After") == header
        again = await ua.final(call_id="m2")            # resent on T1 until the ACK
        assert again.get("To") == final.get("To")
        ua.request(bridge.address, "INVITE", "m2", body=offer(9), branch=branch)
        assert (await ua.final(call_id="m2")).status == capacity_status
        await refused(bridge, ua, "m2", capacity_status)
        (line,) = refusals(events)
        assert (line["call_id"], line["status"], line["reason"]) == \
            ("m2", capacity_status, "capacity")
        assert line["from"] == f"<sip:ua@127.0.0.1:{ua.port}>;tag=ua1"
        assert line["source"] == f"127.0.0.1:{ua.port}"
        assert bridge.stats.calls_refused == 1 and bridge.stats.refusals == {"capacity": 1}
        assert len(bridge.calls) == 1
    run(scenario, cfg=cfg)


@pytest.mark.parametrize("node_kw, cfg_kw, reason, retry_after", [
    ({"slots": 0}, {}, "node_capacity", "5"),
    ({"refuse": "draining"}, {}, "node_draining", "5"),
    ({"refuse": "invalid"}, {}, "node_invalid", None),
    ({"open_delay": 2.0}, {"open_timeout": 0.3}, "node_unavailable", "5"),
])
def test_node_refusals_leave_one_line_and_a_count(node_kw, cfg_kw, reason, retry_after):
    """A node refusal was counted only when the node said no, never logged, and a node that did
    not answer was neither logged nor counted."""
    async def scenario(bridge, node, ua, events):
        ua.request(bridge.address, "INVITE", "n1", body=offer(9))
        final = await refused(bridge, ua, "n1", 503)
        assert final.get("Retry-After") == retry_after
        await asyncio.sleep(0.2)                        # the final's resends, if any, pass
        (line,) = refusals(events)
        assert (line["call_id"], line["status"], line["reason"]) == ("n1", 503, reason)
        assert bridge.stats.calls_refused == 1 and bridge.stats.refusals == {reason: 1}
        assert not bridge.calls
    run(scenario, node_kw, cfg=replace(CFG, **cfg_kw))


def test_every_refused_offer_leaves_one_line_and_a_count_and_nothing_else_does():
    """Refusals before the node is asked (bad SDP, no common codec, wrong body type, missing
    Contact, Require, SIP version, broken request) left no trace but `finals`; an unparseable
    Contact was taken, failed the answer after the node session opened and left the call, its
    RTP port and its node session open for good (an internal error); a retransmitted
    INVITE must not count twice, and errors that refuse no call (a re-INVITE's 488, REGISTER's
    405) must not count at all."""
    async def scenario(bridge, node, ua, events):
        dest = bridge.address
        _, tag = await establish(bridge, ua, "live")
        cases = [("sdp", dict(body=b"v=0\r\nnot sdp"), 400, "bad_sdp"),
                 ("codec", dict(body=offer(9, 18, "G729")), 488, "no_common_codec"),
                 ("ctype", dict(body=b"hi", ctype="text/plain"), 415, "unsupported_media_type"),
                 ("contact", dict(body=offer(9), contact=False), 400, "bad_request"),
                 ("badcontact", dict(body=offer(9), contact=False,
                                     extra=["Contact: <sip:unterminated"]), 400, "bad_request"),
                 ("require", dict(body=offer(9), extra=["Require: 100rel"]), 420,
                  "unsupported_extension")]
        for call_id, kw, status, _ in cases:
            branch = ua.request(dest, "INVITE", call_id, **kw)
            await ua.final(call_id=call_id)
            ua.request(dest, "INVITE", call_id, branch=branch, **kw)     # a retransmission
            await refused(bridge, ua, call_id, status)
        ua.transport.sendto(b"INVITE sip:x SIP/3.0\r\nVia: SIP/3.0/UDP h;branch=z9hG4bK1\r\n"
                            b"From: <sip:a@b>;tag=1\r\nTo: <sip:b@c>\r\nCall-ID: v3\r\n"
                            b"CSeq: 1 INVITE\r\n\r\n", dest)
        assert (await ua.final(call_id="v3")).status == 505
        ua.transport.sendto(b"INVITE sip:x SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK2\r\n"
                            b"From: <sip:a@b>;tag=1\r\nTo: <sip:b@c>\r\nCall-ID: nocseq\r\n\r\n",
                            dest)
        assert (await ua.final(call_id="nocseq")).status == 400
        ua.request(dest, "INVITE", "live", cseq=2, to_tag=tag, body=offer(9, 8, "PCMA"))
        assert (await ua.final(call_id="live")).status == 488         # refuses no call
        ua.request(dest, "REGISTER", "r1")
        assert (await ua.final(call_id="r1")).status == 405
        await asyncio.sleep(0.2)                       # resent finals and ACKs settle
        lines = refusals(events)
        expected = [(c, s, r) for c, _, s, r in cases] + \
            [("v3", 505, "bad_version"), ("nocseq", 400, "bad_request")]
        assert [(e["call_id"], e["status"], e["reason"]) for e in lines] == expected
        assert all(e["from"] and e["source"] for e in lines)
        assert bridge.stats.calls_refused == len(expected)
        assert sum(bridge.stats.refusals.values()) == len(expected)
        assert bridge.stats.refusals["bad_request"] == 3
        assert bridge.stats.internal_errors == 0 and len(bridge.calls) == 1      # "live"
    run(scenario)


def test_cli_chooses_status_and_retry_after_and_refuses_nonsense():
    """There was no way to choose 486 over 503 or the Retry-After value; a value a caller could
    not use (a 404, negative or fractional seconds) must stop the bridge at start."""
    cfg = parse_args([])
    assert (cfg.capacity_status, cfg.retry_after, cfg.telephone_event) == (503, 5, True)
    cfg = parse_args(["--capacity-status", "486", "--retry-after", "30",
                      "--no-telephone-event"])
    assert (cfg.capacity_status, cfg.retry_after, cfg.telephone_event) == (486, 30, False)
    for bad in (["--capacity-status", "404"], ["--retry-after", "-1"],
                ["--retry-after", "1.5"], ["--retry-after", "86401"]):
        with pytest.raises(SystemExit) as exc:
            parse_args(bad)
        assert exc.value.code == 2, bad
    for bad in ({"capacity_status": 404}, {"retry_after": -1}, {"retry_after": 2.5}):
        with pytest.raises(ValueError):
            BridgeConfig(**bad)


def test_cli_help_documents_the_flags(capsys):
    """The flags must say what they do where an operator looks: --help."""
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--capacity-status {503,486}" in out and "486 Busy Here" in out
    assert "--retry-after SECONDS" in out and "0 sends none" in out
    assert "--no-telephone-event" in out and "call_refused" in out


def _kernel_limit(name: str) -> int | None:
    try:
        return int(Path(f"/proc/sys/net/core/{name}").read_text())
    except (OSError, ValueError):
        return None


def _assert_sized(sock, name: str, wanted: int, limit_name: str) -> None:
    got = sockbuf.granted(sock, name)
    limit = _kernel_limit(limit_name)
    if got < wanted and limit is not None and limit < wanted:
        pytest.skip(f"net.core.{limit_name} = {limit} caps {name} below {wanted}")
    assert got >= wanted, f"{name} {got} < {wanted}: left at the kernel's default"


def test_sip_and_rtp_sockets_get_their_burst_buffers():
    """A socket left at the kernel's default (about 208 KiB of accounting on Linux, 106 KiB
    usable) drops what arrives while the loop is busy: INVITE bursts on SIP, seconds of audio
    behind a stall on RTP."""
    async def scenario(bridge, node, ua, events):
        sip = bridge.transport.get_extra_info("socket")
        _assert_sized(sip, "rcvbuf", CFG.sip_rcvbuf, "rmem_max")
        _assert_sized(sip, "sndbuf", CFG.sip_sndbuf, "wmem_max")
        await establish(bridge, ua)
        (call,) = bridge.calls
        media = call.transport.get_extra_info("socket")
        _assert_sized(media, "rcvbuf", CFG.rtp_rcvbuf, "rmem_max")
        _assert_sized(media, "sndbuf", CFG.rtp_sndbuf, "wmem_max")
    run(scenario)


async def run_sipp(bridge, scenario: str, workdir: Path, timeout=20) -> tuple[int, str]:
    """Run one sipp call of `scenario` against the in-process bridge; (exit code, output)."""
    (workdir / "sc.xml").write_text(scenario)
    proc = await asyncio.create_subprocess_exec(
        _sipp(), f"127.0.0.1:{bridge.address[1]}", "-sf", "sc.xml", "-m", "1", "-l", "1",
        "-i", "127.0.0.1", "-p", str(_free_port()), "-mi", "127.0.0.1",
        "-mp", str(_free_port(even=True)), "-trace_err", "-error_file", "sc.err",
        "-timeout", f"{timeout - 5}s", "-timeout_error", "-nostdin", cwd=workdir,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    err = workdir / "sc.err"
    return proc.returncode, out.decode(errors="replace")[-2000:] + \
        (err.read_text() if err.exists() else "")


# sipp fails the call (exit code 1) unless Retry-After holds exactly the configured seconds
BUSY = (HEAD.format(name="busy", sdp=SDP.format(port="[media_port]", fmt=0, codec="PCMU"))
        + """  <recv response="503">
    <action>
      <ereg regexp="^[[:space:]]*17[[:space:]]*$" search_in="hdr" header="Retry-After:"
            check_it="true" assign_to="retry"/>
    </action>
  </recv>
""" + ACK.format(offset="-1") + '  <Reference variables="retry"/>\n</scenario>\n')


def test_sipp_reads_503_and_retry_after_at_capacity(tmp_path):
    """What a proxy's SIP stack sees at capacity: sipp must parse a 503 whose Retry-After is
    the configured 17 s (not the old 486, nor the old fixed 5), and ACK it so that the bridge
    stops resending."""
    async def scenario(bridge, node, ua, events):
        code, out = await run_sipp(bridge, BUSY, tmp_path)
        assert code == 0, out
        (line,) = refusals(events)
        assert line["reason"] == "capacity" and line["status"] == 503
        assert bridge.stats.calls_refused == 1
    run(scenario, cfg=replace(CFG, max_calls=0, retry_after=17), timeout=30)

