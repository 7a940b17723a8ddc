"""Every row of PROTOCOL.md over a real TCP socket, and malformed input answered with its error
code while the node keeps serving other sessions."""
import asyncio
import contextlib
from types import SimpleNamespace
import os

import msgpack
import numpy as np
import pytest
import zmq
import zmq.asyncio

from transports import protocol as P
from transports.client import Audio, Error, FunctionCall, NodeClient, Refused, Text
from wave_actors.core.sched.session_table import Routed
from wave_actors.node.flood import FloodPolicy
from tests.tcpkit import client_of, events_until, node_on_tcp, raw_dealer, reply

FRAME_F32 = np.zeros(1280, np.float32).tobytes()


def test_ping_open_audio_text_close():
    async def body():
        async with node_on_tcp() as node, client_of(node) as c:
            await c.ping(nonce="n1")
            s = await c.open("a", sample_rate=16000, format="pcm_f32le")
            assert s.opened["frame_ms"] == 80 and s.opened["beat_ms"] == 160
            assert s.opened["output_sample_rate"] == 22050
            assert s.opened["output_format"] == "pcm_s16le"
            for _ in range(30):                         # 2.4 s of speech-like input
                await s.send_audio((0.3 * np.random.randn(1280)).astype(np.float32).tobytes())
            got = await events_until(s, lambda ev, g: sum(isinstance(e, Audio) for e in g) >= 20)
            audio = [e for e in got if isinstance(e, Audio)]
            assert all(len(e.payload) == 3528 for e in audio)          # 1764 s16 samples
            assert [e.seq for e in audio] == list(range(len(audio)))
            assert [e.frame for e in audio] == list(range(len(audio)))
            texts = [e for e in got if isinstance(e, Text)]
            assert {t.channel for t in texts} == {"agent", "user"}
            closed = await s.close()
            assert set(closed.stats) == {"frames_in", "frames_out", "underruns", "dropped",
                                         "late_beats", "dropped_in", "dropped_out"}
            assert closed.stats["dropped"] == closed.stats["dropped_in"] + closed.stats["dropped_out"]
            assert closed.stats["frames_in"] + closed.stats["dropped"] == 30
    asyncio.run(body())


def test_outputs_without_a_session_actor_are_counted_unroutable():
    async def body():
        async with node_on_tcp() as node:
            clock = node.clock_actor
            out = node.executor.alloc_output()
            gone = SimpleNamespace(actor=None)               # a route whose actor is gone
            assert not node._deliver(gone, None)
            handles = [clock.slots.table.admit(("nobody", i), gone) for i in range(2)]
            slots = np.array([h.slot for h in handles])
            clock.route.send(Routed(slots, np.zeros(2, np.int64)), out)   # nobody serves them
            assert clock.stats.unroutable == 2
            for h in handles:
                clock.slots.table.release(h)
    asyncio.run(body())


def test_malformed_messages_on_the_clock_socket_are_counted_and_the_beat_goes_on():
    async def body():
        async with node_on_tcp() as node, client_of(node) as c:
            clock = node.clock_actor
            rogue = node.ctx.socket(zmq.DEALER)
            rogue.setsockopt(zmq.LINGER, 0)
            rogue.connect(clock.endpoint)
            try:
                s = await c.open("a", sample_rate=16000, format="pcm_f32le")
                # The ROUTER prepends the sender's identity: 2, 4 and 3 parts, the last with a
                # header that is not an 8-byte frame number.
                for frames in ([b"one part"], [b"\0" * 8, b"pcm", b"extra"], [b"", b"pcm"]):
                    await rogue.send_multipart(frames)
                for _ in range(8):
                    await s.send_audio(np.zeros(1280, np.float32).tobytes())
                await events_until(s, lambda ev, g: sum(isinstance(e, Audio) for e in g) >= 4)
                assert clock.stats.dropped_frames == 3
                assert clock.task is not None and not clock.task.done()
            finally:
                rogue.close(0)
    asyncio.run(body())


# The edit loop (`make test-fast`) runs the first two (a telephone codec each way, one of them
# resampled); `make test` runs all four.
@pytest.mark.parametrize("rate,fmt,out_rate,out_fmt,out_bytes", [
    (8000, "pcmu", 8000, "pcmu", 640),
    (8000, "pcma", 16000, "pcm_s16le", 2560),
    pytest.param(24000, "pcm_s16le", 24000, "pcm_s16le", 3840, marks=pytest.mark.slow),
    pytest.param(48000, "pcm_f32le", 48000, "pcm_f32le", 15360, marks=pytest.mark.slow),
])
def test_formats_and_rates_give_exact_80ms_frames(rate, fmt, out_rate, out_fmt, out_bytes):
    async def body():
        async with node_on_tcp() as node, client_of(node) as c:
            s = await c.open("f", sample_rate=rate, format=fmt, output_sample_rate=out_rate,
                             output_format=out_fmt)
            n = rate * 80 // 1000 * P.BYTES_PER_SAMPLE[fmt]
            for _ in range(12):
                await s.send_audio(os.urandom(n) if fmt in ("pcmu", "pcma") else bytes(n))
            got = await events_until(s, lambda ev, g: sum(isinstance(e, Audio) for e in g) >= 8)
            assert all(len(e.payload) == out_bytes for e in got if isinstance(e, Audio))
            closed = await s.close()
            assert closed.stats["frames_in"] + closed.stats["dropped"] == 12
    asyncio.run(body())


def test_refusals_capacity_duplicate_invalid_draining():
    async def body():
        async with node_on_tcp(max_sessions=1) as node, client_of(node) as c:
            await c.open("one")
            with pytest.raises(Refused) as dup:
                await c.open("one")
            assert dup.value.reason == "duplicate"
            with pytest.raises(Refused) as cap:
                await c.open("two")
            assert cap.value.reason == "capacity"
            with pytest.raises(Refused) as bad:
                await c.open("three", sample_rate=12345)
            assert bad.value.reason == "invalid" and "sample_rate" in bad.value.message
            node.draining = True
            with pytest.raises(Refused) as drain:
                await c.open("four")
            assert drain.value.reason == "draining"
            assert node.counters.refusals == {"duplicate": 1, "capacity": 1, "invalid": 1,
                                              "draining": 1}
    asyncio.run(body())


@pytest.mark.slow
def test_function_call_and_result_round_trip():
    async def body():
        async with node_on_tcp() as node, client_of(node) as c:
            tools = [{"name": "lookup", "description": "d", "parameters": {}}]
            s = await c.open("fc", tools=tools)
            sender = asyncio.get_running_loop().create_task(_stream_silence(s, 100))
            got = await events_until(s, lambda ev, g: isinstance(ev, FunctionCall), timeout=15)
            call = got[-1]
            assert call.name == "lookup" and call.call_id and call.arguments == "{}"
            await s.function_result(call.call_id, '{"ok": true}')
            sender.cancel()
            closed = await s.close()
            assert not [e for e in got if isinstance(e, Error)]
            assert closed.stats["frames_out"] > 0
    asyncio.run(body())


async def _stream_silence(s, frames):
    for _ in range(frames):
        await s.send_audio(FRAME_F32)
        await asyncio.sleep(0.08)


def test_malformed_input_gets_error_codes_and_node_keeps_serving():
    async def body():
        async with node_on_tcp() as node, client_of(node) as c:
            good = await c.open("good")
            sender = asyncio.get_running_loop().create_task(_stream_silence(good, 40))
            sock = await raw_dealer(node)
            hdr = lambda **h: msgpack.packb({"v": 1, **h})
            cases = [
                ([b"\xc1" + os.urandom(39)], "bad_msgpack"),      # 0xc1: never used by msgpack
                ([msgpack.packb([1, 2, 3])], "bad_header"),
                ([hdr(type="ping", v=2)], "bad_version"),
                ([hdr(type="bogus")], "unknown_type"),
                ([hdr(type="audio", session="nobody", seq=0), b"\0\0\0\0"], "unknown_session"),
                ([hdr(type="audio", session="good", seq="x"), b"\0\0\0\0"], "bad_header"),
                ([hdr(type="audio", session="good", seq=-1), b"\0\0\0\0"], "bad_seq"),
                ([hdr(type="audio", session="good", seq=0)], "bad_payload"),
                ([hdr(type="audio", session="x", seq=0), b"\0" * (P.MAX_PAYLOAD_BYTES + 1)],
                 "too_large"),
                ([hdr(type="close", session="bad id!")], "bad_header"),
                ([hdr(type="ping"), b"", b""], "bad_header"),
                ([hdr(type="close", session="good"), b"x"], "bad_payload"),
            ]
            for frames, code in cases:
                await sock.send_multipart(frames)
                h, _ = await reply(sock)
                assert h["type"] == "error" and h["code"] == code, (frames[:1], h)
                assert h["message"]
            # the raw socket's "good" is another client's session: not reachable from here
            await sock.send_multipart([hdr(type="close", session="good")])
            h, _ = await reply(sock)
            assert h["code"] == "unknown_session"
            # the good session on its own connection still streams, untouched
            await c.ping()
            got = await events_until(good, lambda ev, g: sum(isinstance(e, Audio)
                                                             for e in g) >= 10)
            assert not [e for e in got if isinstance(e, Error)]
            sender.cancel()
            closed = await good.close()
            assert closed.stats["frames_out"] >= 10
            assert node.counters.errors["unknown_session"] == 2
            sock.close(0)
    asyncio.run(body())


def test_bad_seq_and_bad_payload_in_a_live_session_are_counted():
    async def body():
        async with node_on_tcp() as node, client_of(node) as c:
            s = await c.open("s", format="pcm_s16le")
            await s.send_audio(bytes(2560), seq=0)
            await s.send_audio(bytes(2560), seq=0)                  # duplicate
            await s.send_audio(bytes(2559), seq=1)                  # half a sample
            await s.send_audio(bytes(2560), seq=3)                  # arrives before 2
            await s.send_audio(bytes(2560), seq=2)
            got = await events_until(s, lambda ev, g: sum(isinstance(e, Error) for e in g) >= 2)
            codes = sorted(e.code for e in got if isinstance(e, Error))
            assert codes == ["bad_payload", "bad_seq"]
            closed = await s.close()
            st = closed.stats
            # seq 0, 2, 3 were heard (3 frames); the duplicate and the broken payload dropped
            assert st["frames_in"] + st["dropped"] == 3 + 2, st
    asyncio.run(body())


@pytest.mark.slow
def test_vanished_client_is_detected_and_its_slot_freed():
    async def body():
        async with node_on_tcp(max_sessions=1, heartbeat_s=0.2, resume_grace_s=0.5) as node:
            c1 = NodeClient(node.endpoint)
            c1.connect()
            await c1.open("gone")
            await c1.aclose()                                        # vanishes without close
            await asyncio.sleep(1.5)
            assert not node.sessions
            async with client_of(node) as c2:
                s = await c2.open("next")                            # the slot is free again
                await s.close()
            assert node.metrics.closed.labels("lost")._value.get() == 1
    asyncio.run(body())


def test_flood_is_shed_with_an_error_and_the_node_survives():
    async def body():
        async with node_on_tcp(flood=FloodPolicy(rate=50.0, burst=100.0)) as node:
            sock = await raw_dealer(node)
            for i in range(600):
                await sock.send_multipart([msgpack.packb({"v": 1, "type": "ping", "nonce": i})])
            codes = []
            with contextlib.suppress(asyncio.TimeoutError):
                while True:
                    h, _ = await reply(sock, timeout=0.5)
                    codes.append(h.get("code", h["type"]))
            assert "overloaded" in codes and codes.count("pong") < 600
            assert node.counters.flood_drops > 0
            sock.close(0)
            async with client_of(node) as c:                        # others still served
                await c.ping()
    asyncio.run(body())


@pytest.mark.slow
def test_a_prompt_that_does_not_fit_is_refused_invalid_and_holds_no_slot():
    """Bug: instructions past the prompt positions, and tools past the model's five, were cut
    silently (the session ran with a prompt its caller never wrote)."""
    async def body():
        async with node_on_tcp(max_sessions=1) as node, client_of(node) as c:
            tools = [{"name": f"t{i}"} for i in range(6)]
            for instructions, tools_, said in (("x" * 3000, [], "at most 512"),
                                               ("Be brief.", tools, "at most 5")):
                with pytest.raises(Refused) as refused:
                    await c.open("long", instructions=instructions, tools=tools_)
                assert refused.value.reason == "invalid" and said in refused.value.message
            assert node.counters.refusals == {"invalid": 2}
            s = await c.open("fits", instructions="x" * 400)     # the one slot is still free
            await s.close()
    asyncio.run(body())


def test_an_event_reaches_the_models_function_channel_and_bad_ones_are_refused():
    """`event` (a phone's key press): the node hands it to the model as a tool response in
    its function channel; an unknown name or value is `bad_header` and the session goes on.
    Catches keys that never reach the model (the SIP bridge used to log them only) and
    arbitrary text pushed into the model under the name of an event."""
    import json
    from wave_actors.core.function_calls import result_tokens

    async def body():
        async with node_on_tcp() as node, client_of(node) as c:
            seen = []
            events = node.host.events                # what the session reports to the node
            original = events.tokens
            events.tokens = lambda handle, ids: (seen.append((handle, ids)),
                                                  original(handle, ids))
            s = await c.open("keys", sample_rate=16000, format="pcm_f32le")
            sender = asyncio.get_running_loop().create_task(_stream_silence(s, 20))
            await s.send_event("dtmf", "5")
            for name, value in (("dtmf", "55"), ("dtmf", "x"), ("hangup", "1")):
                await c.send(P.pack("event", "keys", name=name, value=value))
            await s.send_event("dtmf", "#")
            got = await events_until(s, lambda ev, g: sum(isinstance(e, Error) for e in g) >= 3
                                     and len(seen) >= 2, timeout=10)
            sender.cancel()
            errors = [e for e in got if isinstance(e, Error)]
            assert [e.code for e in errors] == ["bad_header"] * 3
            want = [result_tokens(node.executor.text_codec,
                                  json.dumps({"event": "dtmf", "value": v}))
                    for v in ("5", "#")]
            assert [ids for _, ids in seen] == want
            closed = await s.close()                 # the session went on to a normal close
            assert closed.stats["frames_in"] + closed.stats["dropped"] > 0
    asyncio.run(body())


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1])
def test_input_ahead_of_real_time_is_held_and_heard_whole(workers):
    """8 s of input sent at once (the clock's jitter buffer holds 4 s and sheds a standing
    excess): the session holds what is ahead of real time and the model hears every frame,
    none dropped. Catches a file client losing the half of its audio the jitter buffer could
    not hold (vllm-omni's gate lost 140 of 190 frames), with and without session workers."""
    async def body():
        async with node_on_tcp(workers=workers) as node, client_of(node) as c:
            s = await c.open("file", sample_rate=16000, format="pcm_f32le")
            for _ in range(100):
                await s.send_audio(FRAME_F32)
            got = await events_until(s, lambda ev, g: sum(isinstance(e, Audio) for e in g)
                                     >= 104, timeout=20)
            closed = await s.close()
            assert not [e for e in got if isinstance(e, Error)]
            assert closed.stats["frames_in"] == 100 and closed.stats["dropped"] == 0, closed.stats
    asyncio.run(body())


def test_input_past_the_hold_is_refused_with_input_overflow():
    """A 1 s hold: 3 s sent at once. What fits is held; the rest is dropped, counted in
    `closed.stats`, and answered `input_overflow` once. Catches an unbounded hold (memory) and
    a silent drop."""
    async def body():
        async with node_on_tcp(input_hold_s=1.0) as node, client_of(node) as c:
            s = await c.open("burst", sample_rate=16000, format="pcm_f32le")
            for _ in range(38):
                await s.send_audio(FRAME_F32)
            got = await events_until(s, lambda ev, g: isinstance(ev, Error), timeout=5)
            errors = [e for e in got if isinstance(e, Error)]
            assert [e.code for e in errors] == ["input_overflow"]
            closed = await s.close()
            assert closed.stats["frames_in"] + closed.stats["dropped"] == 38
            assert closed.stats["dropped"] >= 38 - 13 - 3, closed.stats
    asyncio.run(body())
