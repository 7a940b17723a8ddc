"""Tool results a client sends faster than the model hears them (one token a frame) are refused
past a bound. The bug: every `function_result` was queued whole in the slot book, so one client
could grow the node's memory without bound (a 32 KB result is ~32,000 tokens, 43 minutes of
frames; a stream of them never drained)."""
import asyncio

from tests.nodekit import VirtualNode
from transports.client import Error
from wave_actors.sessions.session import TOOL_BACKLOG


def test_a_stream_of_large_tool_results_is_refused_past_the_backlog_and_counted():
    vn = VirtualNode(max_sessions=1)
    try:
        async def go():
            s = await vn.client.open("tools", sample_rate=16000, format="pcm_f32le")
            actor = vn.node.sessions[(vn.client.identity, "tools")]
            big = "x" * 30_000                       # the protocol admits up to 32 KB
            for i in range(5):
                await s.function_result(f"call-{i}", big)
            await asyncio.sleep(0.5)
            errors = []
            while not s.events.empty():
                ev = s.events.get_nowait()
                if isinstance(ev, Error):
                    errors.append(ev)
            forced = sum(len(st.forced) for st in vn.node.clock_actor.slots.book.slots)
            return actor.counters.tool_refused, errors, forced
        refused, errors, forced = vn.run(go())
    finally:
        vn.close()
    assert refused == 4 and len(errors) == 4
    assert all(e.code == "overloaded" and "still to be heard" in e.message for e in errors)
    assert 30_000 <= forced <= TOOL_BACKLOG                # the first one is heard, in full
