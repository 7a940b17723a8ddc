"""The client's side of liveness (`NodeClient`'s heartbeat, docs/PROTOCOL.md) against a real
node on TCP."""
import asyncio

import pytest

from tests.tcpkit import client_of, node_on_tcp


@pytest.mark.slow
def test_a_client_opening_calls_faster_than_its_heartbeat_keeps_its_quiet_calls():
    """Bug: each open restarted the client's heartbeat wait, so a bridge that opened calls more
    often than once a heartbeat sent no ping at all, and its calls that sent no audio meanwhile
    (a listener, a text-only client) were closed as idle."""
    async def body():
        async with node_on_tcp(max_sessions=32, heartbeat_s=0.2, idle_timeout_s=1.0) as node, \
                client_of(node) as c:
            quiet = await c.open("quiet")
            opens = []
            for i in range(25):                     # 2.5 s of opens, 10 a second
                opens.append(asyncio.ensure_future(c.open(f"busy{i}")))
                await asyncio.sleep(0.1)
            busy = await asyncio.gather(*opens)
            assert quiet.closed is None and all(s.closed is None for s in busy)
            for s in [quiet, *busy]:
                assert "idle" not in str((await s.close()).stats.get("reason"))
    asyncio.run(body())
