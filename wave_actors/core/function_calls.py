"""The function channel, both ways: model tokens -> calls, tool results -> forced tokens.

docs/MODEL.md §6: `<SPECIAL_20>` opens a call, `<SPECIAL_21>` closes it, and the text between is
`<TOOLCALL>[{"name": ..., "arguments": ...}]</TOOLCALL>`. A result goes back as
`<TOOL_RESPONSE>[...]</TOOL_RESPONSE>` followed by `<SPECIAL_22>`, forced one token per frame.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from wave_actors.core.text import CALL_END, CALL_START, RESPONSE_END
from wave_actors.core.contract import TextCodec

MAX_CALL_TOKENS = 8192          # a call longer than this is a runaway model, not a call


@dataclass
class ParsedCall:
    call_id: str
    name: str
    arguments: str              # JSON text


class FunctionCallParser:
    def __init__(self, codec: TextCodec, session: str):
        self._codec, self._session = codec, session
        self._buf: list[int] | None = None
        self._n = 0
        self._errors: list[str] = []

    def push(self, token: int) -> list[ParsedCall]:
        if token == CALL_START:
            if self._buf is not None:
                self._errors.append("function call opened twice; the first one was discarded")
            self._buf = []
            return []
        if self._buf is None:
            return []
        if token == CALL_END:
            ids, self._buf = self._buf, None
            return self._parse(self._codec.decode_bytes(ids).decode("utf-8", "replace"))
        self._buf.append(token)
        if len(self._buf) > MAX_CALL_TOKENS:
            self._errors.append(f"function call longer than {MAX_CALL_TOKENS} tokens discarded")
            self._buf = None
        return []

    def take_errors(self) -> list[str]:
        errors, self._errors = self._errors, []
        return errors

    def _parse(self, text: str) -> list[ParsedCall]:
        body = text.strip()
        if body.startswith("<TOOLCALL>") and body.endswith("</TOOLCALL>"):
            body = body[len("<TOOLCALL>"):-len("</TOOLCALL>")]
        try:
            items = json.loads(body)
        except json.JSONDecodeError as exc:
            self._errors.append(f"function call is not JSON ({exc.msg}): {text[:200]!r}")
            return []
        if isinstance(items, dict):
            items = [items]
        calls = []
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                self._errors.append(f"function call without a name: {item!r:.200}")
                continue
            args = item.get("arguments", {})
            self._n += 1
            calls.append(ParsedCall(f"call_{self._session}_{self._n}", item["name"],
                                    args if isinstance(args, str) else json.dumps(args)))
        return calls


def result_tokens(codec: TextCodec, output: str) -> list[int]:
    """Tokens that force a tool result into the function channel."""
    return codec.encode("<TOOL_RESPONSE>[" + json.dumps(output) + "]</TOOL_RESPONSE>") + [RESPONSE_END]
