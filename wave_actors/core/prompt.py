"""The system prompt a session prefills (docs/MODEL.md §2.4 prefill, §6 function channel).

Text: the session's instructions, then, when it has tools, a blank line and
`<AVAILABLE_TOOLS>[tool, tool, …]</AVAILABLE_TOOLS>` with each tool as compact JSON (an OpenAI
`{"type": "function", "function": {…}}` entry is unwrapped to its `function` object), the
Nemotron-Nano chat template's tool block (inferred; VO renders tools into the system prompt the
same way). Tokens: [bos] + tok(text) + [eos], one thinker position each.

Torch-free: the node can size prompts without importing the model.
"""
from __future__ import annotations

import json

from wave_actors.core.text import BOS, EOS
from wave_actors.core.contract import TextCodec

MAX_TOOLS = 5           # VO's limit (§6)


class PromptRejected(ValueError):
    """A session's instructions and tools do not fit the prompt the model takes: the node
    refuses its `open` as `invalid` with this message (a prompt is never cut silently)."""


def tool_schema(tool: dict) -> dict:
    """The object rendered for one tool: the `function` body of an OpenAI-style entry, else as is."""
    if isinstance(tool.get("function"), dict):
        return tool["function"]
    return tool


def render_system_prompt(instructions: str, tools: list[dict] | None = None) -> str:
    tools = list(tools or [])
    if len(tools) > MAX_TOOLS:
        raise PromptRejected(f"{len(tools)} tools; the model takes at most {MAX_TOOLS}")
    if not tools:
        return instructions
    block = "<AVAILABLE_TOOLS>[" + ", ".join(
        json.dumps(tool_schema(t), ensure_ascii=False, separators=(",", ":")) for t in tools
    ) + "]</AVAILABLE_TOOLS>"
    return f"{instructions}\n\n{block}" if instructions else block


def prompt_tokens(codec: TextCodec, instructions: str, tools: list[dict] | None = None) -> list[int]:
    """[bos] + tok(system prompt) + [eos]: the thinker positions of a session's prefill."""
    return [BOS] + codec.encode(render_system_prompt(instructions, tools)) + [EOS]


def fitted_prompt_tokens(codec: TextCodec, instructions: str, tools: list[dict] | None,
                         max_prompt: int) -> list[int]:
    """`prompt_tokens`, or PromptRejected when they take more than the `max_prompt` positions
    reserved for a session's prompt (the limit is in the message)."""
    tokens = prompt_tokens(codec, instructions, tools)
    if len(tokens) > max_prompt:
        raise PromptRejected(
            f"instructions and tools take {len(tokens)} prompt tokens; this node takes at most "
            f"{max_prompt} (about {max_prompt - 2} tokens of text with its markers)")
    return tokens
