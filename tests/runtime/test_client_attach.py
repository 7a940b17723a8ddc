"""A client takes over a call another client opened (`NodeClient.attach`, by its resume token):
what a bridge that restarted, or another bridge the caller reached, does with a live call."""
import asyncio

import pytest

from tests.tcpkit import client_of, node_on_tcp, stream
from transports.client import Audio, NodeClient, Refused


async def audio_out(session, n: int, timeout: float = 5.0) -> int:
    """Reads until `n` audio events came (other events skipped); how many came."""
    got = 0
    while got < n:
        if isinstance(await session.next_event(timeout), Audio):
            got += 1
    return got


def test_a_second_client_takes_over_a_live_call_by_its_token_and_goes_on():
    """Bug it catches: audio from the new client numbered from 0 while the node waits for the
    seq it had reached (taken for duplicates and dropped), a takeover that never binds, or one
    that a wrong token gets."""
    async def body():
        async with node_on_tcp(heartbeat_s=0.5, resume_grace_s=5.0) as node:
            first = NodeClient(node.endpoint)
            first.connect()
            call = await first.open("call")
            await stream(call, 6, period=0.08)
            await audio_out(call, 2)
            token = call.token
            await first.aclose()                    # its bridge is gone; the call lives on
            async with client_of(node) as second:
                with pytest.raises(Refused) as wrong:
                    await second.attach("call", "0" * 32, timeout=3.0)
                assert wrong.value.reason == "unknown" and "call" not in second.sessions
                taken = await second.attach("call", token)
                assert taken.closed is None and taken.resumes == 1 and taken.seq >= 6
                await stream(taken, 6, period=0.08)
                assert await audio_out(taken, 3) == 3            # the model goes on speaking
                await asyncio.sleep(0.3)                         # the last frames heard
                closed = await taken.close()
                assert closed.stats["frames_in"] == 12 and closed.stats["dropped_in"] == 0
    asyncio.run(body())
