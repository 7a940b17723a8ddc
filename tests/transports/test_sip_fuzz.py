"""The SIP bridge under `chaos.sip_fuzz`: a real bridge (in this process) on a real node (sim
backend, a subprocess) takes ~200 malformed SIP datagrams and RTP garbage from a few source
ports while one well-behaved call is up; afterwards the bridge still answers OPTIONS and a new
INVITE, the call still carries audio both ways, and nothing raised inside the bridge.
"""
import asyncio
import socket
from dataclasses import replace

import pytest

from chaos import sip_fuzz, sip_plan
from tests.transports.sipkit import UA, establish
from tests.transports.sipp_stack import PY, Proc, _free_port
from tests.transports.test_sip_strict_rtp import QUIET, Media, rtp_dest, sdp_offer, until
from transports.sip.config import BridgeConfig
from transports.sip.media import rtp
from transports.sip.server import Bridge

COUNT, SEED = 200, 7


@pytest.fixture(scope="module")
def node():
    endpoint = f"tcp://127.0.0.1:{_free_port(socket.SOCK_STREAM)}"
    proc = Proc([PY, "-m", "wave_actors.node", "--bind", endpoint, "--backend", "sim",
                 "--max-sessions", "4"], "node")
    try:
        proc.wait_for(lambda: any("listening" in ln for ln in proc.lines), 30, "listening line")
        yield endpoint
    finally:
        proc.stop()


def test_the_plan_is_the_same_for_a_seed_and_differs_between_seeds():
    # a fuzz failure must replay: same seed, same datagrams in the same order
    a = sip_plan.plan(COUNT, SEED, "127.0.0.1", 5060)
    assert a == sip_plan.plan(COUNT, SEED, "127.0.0.1", 5060)
    assert a != sip_plan.plan(COUNT, SEED + 1, "127.0.0.1", 5060)
    assert sum(not d.rtp for d in a) == COUNT and any(d.rtp for d in a)
    assert {d.kind for d in a if not d.rtp} == set(sip_plan.MUTATORS)
    assert max(len(d.data) for d in a) <= sip_plan.MAX_DATAGRAM


@pytest.mark.slow
def test_bridge_survives_the_fuzzer_and_a_live_call_keeps_its_audio(node):
    cfg = replace(BridgeConfig(node=node, port=0), t1=0.1, t2=0.4)

    async def main():
        events = []
        bridge = Bridge(cfg, emit=lambda ev, **f: events.append({"event": ev, **f}))
        await bridge.start()
        ua, caller = await UA.create(), await Media.open()
        talking = None
        try:
            ok, tag = await establish(bridge, ua, "victim", body=sdp_offer(caller.port))
            dest, (call,) = rtp_dest(ok), bridge.calls
            voice = rtp.RtpSender(0)

            async def talk():
                while True:
                    caller.send(voice.packet(QUIET, 160), dest)
                    await asyncio.sleep(0.02)
            talking = asyncio.get_running_loop().create_task(talk())
            stats = await sip_fuzz.run("127.0.0.1", bridge.address[1], COUNT, SEED)
            assert stats["tried"] == COUNT and not stats["timed_out"], stats
            assert stats["answered"] > COUNT // 4, stats        # the bridge said no, often
            assert stats["control_status"] == 200 and stats["rtp_sent"] > 0, stats

            ua.request(bridge.address, "OPTIONS", "after-options")
            assert (await ua.final()).status == 200
            heard, played = len(caller.rx), call.jitter.stats.played
            assert await until(lambda: len(caller.rx) >= heard + 25), "no audio back after fuzz"
            assert await until(lambda: call.jitter.stats.played >= played + 25)
            assert call in bridge.calls and call.end_reason is None
            assert call.stats.rtp_foreign == 0                   # the fuzz hit its own call
            assert await until(lambda: bridge.calls == {call}), bridge.calls
            _, tag2 = await establish(bridge, ua, "after-invite", body=sdp_offer(9))
            ua.request(bridge.address, "BYE", "after-invite", cseq=2, to_tag=tag2)
            assert (await ua.final()).status == 200
        finally:
            if talking is not None:
                talking.cancel()
            ua.transport.close()
            caller.transport.close()
            await bridge.close(timeout=0.5)
        assert bridge.stats.internal_errors == 0, [e for e in events
                                                   if e["event"] == "internal_error"]
        ends = [e for e in events if e["event"] == "call_end"]
        control = [e for e in ends if e["call_id"].startswith("fuzz-")
                   and e["rtp"]["rtp_in"] > 0]
        assert control and control[0]["rtp"]["rtp_foreign"] > 0   # RTP from its other ports
    asyncio.run(asyncio.wait_for(main(), 120))
