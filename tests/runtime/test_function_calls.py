"""The function channel: tokens to calls and tool results to forced tokens."""
import json

from wave_actors.core.text import CALL_END, CALL_START, RESPONSE_END, ByteFallbackCodec
from wave_actors.core.function_calls import FunctionCallParser, result_tokens

codec = ByteFallbackCodec()


def feed(parser, ids):
    calls = []
    for t in ids:
        calls += parser.push(t)
    return calls


def test_a_call_between_markers_is_parsed():
    p = FunctionCallParser(codec, "s1")
    text = '<TOOLCALL>[{"name": "weather", "arguments": {"city": "Paris"}}]</TOOLCALL>'
    calls = feed(p, [12, 12, CALL_START] + codec.encode(text) + [CALL_END, 12])
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("weather", {"city": "Paris"})]
    assert calls[0].call_id == "call_s1_1" and not p.take_errors()
    again = feed(p, [CALL_START] + codec.encode('[{"name": "x"}]') + [CALL_END])
    assert again[0].call_id == "call_s1_2" and again[0].arguments == "{}"


def test_broken_calls_are_reported_not_raised():
    p = FunctionCallParser(codec, "s")
    assert feed(p, [CALL_START] + codec.encode("<TOOLCALL>[{nope") + [CALL_END]) == []
    assert "not JSON" in p.take_errors()[0]
    assert feed(p, [CALL_START] + codec.encode('[{"arguments": 1}]') + [CALL_END]) == []
    assert "without a name" in p.take_errors()[0]
    assert feed(p, codec.encode('[{"name": "x"}]') + [CALL_END]) == []    # no opening marker


def test_result_tokens_wrap_and_terminate():
    ids = result_tokens(codec, '{"t": 21}')
    assert ids[-1] == RESPONSE_END
    text = codec.decode_bytes(ids[:-1]).decode()
    assert text.startswith("<TOOL_RESPONSE>[") and text.endswith("]</TOOL_RESPONSE>")
    assert json.loads(text[len("<TOOL_RESPONSE>"):-len("</TOOL_RESPONSE>")]) == ['{"t": 21}']
