"""Unit tests of the Realtime bridge's pure parts: event mapping, session config, audio, outbox.

No sockets here; tests/transports/test_realtime_e2e.py runs real clients against the real node.
"""
import asyncio
import base64
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transports.audio import encode
from transports.realtime.codec import Converter
from transports.realtime.conversation import AUDIO_DELTA_TYPES, BETA_NAMES, Conversation, Ids
from transports.realtime.outbox import Outbox, Overflow
from transports.realtime.session import (DEFAULT_AUDIO, NATIVE_INPUT, AudioSpec, EventError,
                                         SessionConfig, apply_update, parse_audio_format,
                                         parse_event, session_object)

FAST = settings(max_examples=60, deadline=None)

# ---- Conversation: the response/item lifecycle --------------------------------------------

OPS = st.one_of(
    st.tuples(st.just("audio"), st.integers(0, 3), st.binary(min_size=0, max_size=8)),
    st.tuples(st.just("agent"), st.integers(0, 3), st.text(max_size=4)),
    st.tuples(st.just("user"), st.integers(0, 3), st.text(max_size=4)),
    st.tuples(st.just("call"), st.text("abc", min_size=1, max_size=3), st.just("{}")),
    st.tuples(st.just("cancel")), st.tuples(st.just("resume")), st.tuples(st.just("commit")),
    st.tuples(st.just("input")),
)


def run_ops(conv: Conversation, ops) -> tuple[list[dict], list[tuple]]:
    """Apply `ops` (node frames advance by the op's step); return events and (op, events) log."""
    frame, events, log = 0, [], []
    for op in ops:
        kind = op[0]
        if kind in ("audio", "agent", "user"):
            frame += op[1]
        out = {"audio": lambda: conv.audio(frame, op[2]),
               "agent": lambda: conv.agent_text(frame, op[2]),
               "user": lambda: conv.user_text(frame, op[2]),
               "call": lambda: conv.function_call(op[1], "fn", op[2]),
               "cancel": conv.cancel, "resume": lambda: conv.resume() or [],
               "commit": lambda: conv.commit() or [],
               "input": lambda: conv.note_input() or []}[kind]()
        events += out
        log.append((op, out))
    events += conv.closed()
    return events, log


@FAST
@given(st.lists(OPS, max_size=60), st.booleans(), st.integers(1, 4))
def test_conversation_lifecycle_invariants(ops, beta, gap):
    """Every delta lies inside an open response; responses never overlap and all close;
    event ids are unique; items are added before they are done; the dialect's names only."""
    conv = Conversation(beta=beta, ids=Ids("t"), turn_gap_frames=gap)
    events, _ = run_ops(conv, ops)
    assert len({e["event_id"] for e in events}) == len(events)
    open_resp, created, done, items_added, items_done = None, 0, 0, set(), set()
    for e in events:
        t = e["type"]
        assert t not in (set(BETA_NAMES) if beta else set(BETA_NAMES.values()))
        if t == "response.created":
            assert open_resp is None
            open_resp, created = e["response"]["id"], created + 1
        elif t == "response.done":
            assert e["response"]["id"] == open_resp
            assert e["response"]["status"] in ("completed", "cancelled", "incomplete")
            assert all(item["status"] != "in_progress" for item in e["response"]["output"])
            open_resp, done = None, done + 1
        elif t.startswith("response."):
            assert e["response_id"] == open_resp, t
        if t == "response.output_item.added":
            items_added.add(e["item"]["id"])
        if t == "response.output_item.done":
            assert e["item"]["id"] in items_added
            items_done.add(e["item"]["id"])
    assert open_resp is None and created == done
    assert items_added == items_done


@FAST
@given(st.lists(OPS, max_size=60))
def test_audio_is_forwarded_unchanged_unless_muted(ops):
    """Each non-empty output frame becomes exactly one delta of the same bytes while unmuted,
    none while muted; agent text likewise; muted frames are counted."""
    conv = Conversation(ids=Ids("t"))
    muted_frames = 0
    _, log = run_ops(conv, ops)
    muted = False
    for op, out in log:
        muted = {"cancel": True, "resume": False}.get(op[0], muted)
        deltas = [e for e in out if e["type"] in AUDIO_DELTA_TYPES]
        texts = [e for e in out if e["type"] == "response.output_audio_transcript.delta"]
        if op[0] == "audio":
            muted_frames += muted
            want = [] if muted or not op[2] else [op[2]]
            assert [base64.b64decode(e["delta"]) for e in deltas] == want
        elif op[0] == "agent":
            assert [e["delta"] for e in texts] == ([] if muted or not op[2] else [op[2]])
        else:
            assert not deltas and not texts
    assert conv.muted_frames == muted_frames


def test_function_call_ends_its_response_with_call_id():
    conv = Conversation(ids=Ids("t"))
    conv.audio(0, b"\0\0")
    ev = conv.function_call("call_1", "get_weather", '{"city":"Oslo"}')
    types = [e["type"] for e in ev]
    assert types[-1] == "response.done"
    args_done = next(e for e in ev if e["type"] == "response.function_call_arguments.done")
    assert (args_done["call_id"], args_done["name"], args_done["arguments"]) == \
        ("call_1", "get_weather", '{"city":"Oslo"}')
    item_done = [e["item"] for e in ev if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in item_done] == ["message", "function_call"]
    assert item_done[1]["call_id"] == "call_1" and item_done[1]["status"] == "completed"
    assert ev[-1]["response"]["output"][1]["call_id"] == "call_1"


def test_turn_gap_cuts_responses_and_user_items():
    conv = Conversation(ids=Ids("t"), turn_gap_frames=3)
    conv.audio(0, b"\1\0")
    conv.agent_text(0, "hi")
    conv.user_text(0, "yo")
    assert not [e for e in conv.audio(2, b"\1\0") if e["type"] == "response.done"]
    out = conv.audio(3, b"\1\0")
    kinds = [e["type"] for e in out]
    assert "response.done" in kinds and "response.created" in kinds     # next one opens
    done = next(e for e in out if e["type"] == "conversation.item.input_audio_transcription"
                ".completed")
    assert done["transcript"] == "yo"


def test_commit_without_input_is_refused_and_cancel_mutes():
    conv = Conversation(ids=Ids("t"))
    assert conv.commit() is None
    conv.note_input()
    assert conv.commit()[0]["type"] == "input_audio_buffer.committed"
    conv.audio(0, b"\1\0")
    assert conv.cancel()[-1]["response"]["status"] == "cancelled"
    assert conv.audio(1, b"\1\0") == [] and conv.muted_frames == 1
    conv.resume()
    assert any(e["type"] == "response.output_audio.delta" for e in conv.audio(2, b"\1\0"))


def test_beta_names():
    conv = Conversation(beta=True, ids=Ids("t"))
    types = [e["type"] for e in conv.audio(0, b"\1\0") + conv.agent_text(0, "a")]
    assert "response.audio.delta" in types and "response.audio_transcript.delta" in types
    assert "conversation.item.created" in types
    assert conv.error("x", "y", "evt_1")[0]["error"] == {
        "type": "invalid_request_error", "code": "x", "message": "y", "param": None,
        "event_id": "evt_1"}


# ---- session config -------------------------------------------------------------------------

@pytest.mark.parametrize("value,spec", [
    ("pcm16", AudioSpec("pcm_s16le", 24000)), ("pcm_f32le", AudioSpec("pcm_f32le", 16000)),
    ("g711_ulaw", AudioSpec("pcmu", 8000)), ("g711_alaw", AudioSpec("pcma", 8000)),
    ({"type": "audio/pcm", "rate": 24000}, AudioSpec("pcm_s16le", 24000)),
    ({"type": "audio/pcm", "rate": 22050}, AudioSpec("pcm_s16le", 22050)),
    ({"type": "audio/pcmu"}, AudioSpec("pcmu", 8000)),
])
def test_audio_formats(value, spec):
    assert parse_audio_format(value, "p") == spec
    assert parse_audio_format(spec.ga(), "p") == spec          # what we report parses back
    assert parse_audio_format(spec.beta(), "p") == spec


@pytest.mark.parametrize("value", ["mp3", {"type": "audio/pcm", "rate": 11025}, 7,
                                   {"type": "audio/pcmu", "rate": 16000}])
def test_bad_audio_formats(value):
    with pytest.raises(EventError) as exc:
        parse_audio_format(value, "session.input_audio_format")
    assert exc.value.code == "invalid_value"


def test_session_update_beta_and_ga_agree():
    tools = [{"type": "function", "name": "f", "description": "d", "parameters": {}}]
    beta = apply_update(SessionConfig(), {"instructions": "x", "tools": tools, "voice": "v",
                                          "input_audio_format": "g711_ulaw",
                                          "output_audio_format": "pcm16",
                                          "turn_detection": None, "modalities": ["audio"]}, False)
    ga = apply_update(SessionConfig(), {"type": "realtime", "instructions": "x", "tools": tools,
                                        "audio": {"input": {"format": {"type": "audio/pcmu"}},
                                                  "output": {"format": {"type": "audio/pcm"},
                                                             "voice": "v"}},
                                        "output_modalities": ["audio"]}, False)
    assert beta == ga
    assert beta.tools == ({"name": "f", "description": "d", "parameters": {}},)
    for dialect in (True, False):
        obj = session_object(beta, "s", dialect)
        assert obj["capabilities"]["implementation_level"] == "model_native_duplex"
        assert obj["capabilities"]["chunk_period_ms"] == 80
        assert obj["capabilities"]["supports_multi_session"] is True


def test_instructions_and_tools_are_immutable_once_open():
    cfg = apply_update(SessionConfig(), {"instructions": "a"}, False)
    assert apply_update(cfg, {"instructions": "a", "input_audio_format": "pcm_f32le"},
                        True).input == NATIVE_INPUT
    for change in ({"instructions": "b"}, {"tools": [{"name": "g"}]}):
        with pytest.raises(EventError) as exc:
            apply_update(cfg, change, True)
        assert exc.value.code == "immutable_session_field"


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) |
                    st.text(max_size=8),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c,
                                                                        max_size=5),
                    max_leaves=20)
KEYS = st.sampled_from(["instructions", "tools", "input_audio_format", "output_audio_format",
                        "audio", "voice", "modalities", "type"])


@FAST
@given(st.dictionaries(KEYS, JSON, max_size=5), st.booleans())
def test_session_update_takes_anything(session, opened):
    """Any JSON session object yields a config or an EventError, nothing else."""
    try:
        cfg = apply_update(SessionConfig(), session, opened)
    except EventError as exc:
        assert exc.code and exc.message
    else:
        assert isinstance(cfg.input, AudioSpec) and isinstance(cfg.tools, tuple)


@FAST
@given(st.one_of(st.text(max_size=40), st.binary(max_size=10), JSON.map(json.dumps)))
def test_parse_event_takes_anything(text):
    try:
        ev = parse_event(text, 1000)
    except EventError as exc:
        assert exc.code in ("invalid_json", "invalid_event", "message_too_large")
    else:
        assert isinstance(ev, dict) and isinstance(ev["type"], str)


# ---- audio conversion -------------------------------------------------------------------

@pytest.mark.parametrize("src", [DEFAULT_AUDIO, AudioSpec("pcmu", 8000), AudioSpec("pcma", 8000),
                                 NATIVE_INPUT])
@FAST
@given(cuts=st.lists(st.integers(1, 900), min_size=1, max_size=12))
def test_converter_chunked_equals_one_shot(src, cuts):
    """Streaming conversion of any chunking equals converting the whole signal at once."""
    n = src.rate // 5                                          # 200 ms
    t = np.arange(n) / src.rate
    data = encode((0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), src.fmt)
    bps = src.bytes_per_sample
    whole = Converter(src, NATIVE_INPUT)(data, last=True)
    conv, parts, pos = Converter(src, NATIVE_INPUT), [], 0
    for c in cuts:
        parts.append(conv(data[pos:pos + c * bps]))
        pos = min(len(data), pos + c * bps)
    parts.append(conv(data[pos:], last=True))
    a, b = np.frombuffer(b"".join(parts), "<f4"), np.frombuffer(whole, "<f4")
    assert len(a) == len(b) and abs(len(a) - n * 16000 // src.rate) <= 2
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_converter_rejects_partial_samples_and_passes_native_through():
    with pytest.raises(EventError):
        Converter(DEFAULT_AUDIO, NATIVE_INPUT)(b"\0\0\0")
    raw = np.arange(10, dtype="<f4").tobytes()
    assert Converter(NATIVE_INPUT, NATIVE_INPUT)(raw) is raw


# ---- the outbox -------------------------------------------------------------------------

@FAST
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 50), st.booleans()), max_size=80))
def test_outbox_bounds(steps):
    """size <= hard always; audio never lifts size past max_bytes; drops are counted; what is
    kept comes out in order."""
    async def go():
        ob = Outbox(100, 300, now=lambda: 0.0)
        kept, got, refused = [], [], 0
        for i, (droppable, n, take) in enumerate(steps):
            text = f"{i:03d}" + "x" * n
            before = ob.size
            try:
                if ob.put(text, droppable):
                    kept.append(text)
                    assert not droppable or ob.size <= 100
                else:
                    refused += 1
                    assert droppable and before + len(text) > 100
            except Overflow:
                assert not droppable and before + len(text) > 300
            assert ob.size <= 300
            if take and len(ob):
                got.append(await ob.get())
        while len(ob):
            got.append(await ob.get())
        assert got == kept and ob.dropped == refused and ob.size == 0
    asyncio.run(go())
