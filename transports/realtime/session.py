"""Session configuration of the Realtime dialect: audio formats, `session.update`, `session.*` events.

A client describes its session in either dialect of the OpenAI Realtime API: the beta one
(`input_audio_format: "pcm16"`, `modalities`, `voice`) or the GA one (`type: "realtime"`,
`audio.input.format: {type: "audio/pcm", rate: 24000}`, `output_modalities`). Both parse into one
frozen `SessionConfig`; `apply_update` returns a new config or raises `EventError`, never
half-applies. Instructions and tools are fixed when the node session opens (the model renders them
into its prompt at prefill), so a later update that changes them is refused as a whole.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from transports import protocol as P
from wave_actors.core.frames import BEAT_MS, FRAME_MS, IN_RATE, OUT_RATE

MAX_TOOLS = P.MAX_TOOLS


class EventError(Exception):
    """A client event that cannot be honoured; becomes an `error` server event."""

    def __init__(self, code: str, message: str, param: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.code, self.message, self.param, self.kind = code, message, param, kind


@dataclass(frozen=True)
class AudioSpec:
    """One direction's audio on the client's side: a wire format of `protocol.FORMATS` at `rate`."""
    fmt: str
    rate: int

    @property
    def bytes_per_sample(self) -> int:
        return P.BYTES_PER_SAMPLE[self.fmt]

    @property
    def frame_bytes(self) -> int:
        """Bytes of one 80 ms frame in this format."""
        return self.rate * FRAME_MS // 1000 * self.bytes_per_sample

    def beta(self) -> Any:
        """The beta dialect's name where one exists, else the GA object (an extension)."""
        for name, spec in NAMED.items():
            if spec == self:
                return name
        return self.ga()

    def ga(self) -> dict:
        kind = GA_TYPE_OF[self.fmt]
        return {"type": kind} if self.fmt in ("pcmu", "pcma") else {"type": kind, "rate": self.rate}


NAMED = {"pcm16": AudioSpec("pcm_s16le", 24000), "pcm_f32le": AudioSpec("pcm_f32le", IN_RATE),
         "g711_ulaw": AudioSpec("pcmu", 8000), "g711_alaw": AudioSpec("pcma", 8000)}
GA_TYPES = {"audio/pcm": AudioSpec("pcm_s16le", 24000), "audio/pcmu": AudioSpec("pcmu", 8000),
            "audio/pcma": AudioSpec("pcma", 8000), "audio/pcm_f32le": AudioSpec("pcm_f32le", IN_RATE)}
GA_TYPE_OF = {spec.fmt: name for name, spec in GA_TYPES.items()}
DEFAULT_AUDIO = NAMED["pcm16"]                   # what OpenAI clients send and expect
NATIVE_INPUT = AudioSpec("pcm_f32le", IN_RATE)   # what the model hears (node passes it through)
NATIVE_OUTPUT = AudioSpec("pcm_s16le", OUT_RATE)  # what the codec speaks, as pcm16

CAPABILITIES = {
    "implementation_level": "model_native_duplex",
    "chunk_period_ms": FRAME_MS,
    "beat_ms": BEAT_MS,
    "supports_multi_session": True,
    "supports_barge_in": True,           # input is heard while the model speaks; the model yields
    "supports_server_vad": False,        # no turn detection: the model speaks on its own clock
    "supports_core_resumable_request": False,
    "supports_core_kv_lease": False,
    "input_modes": ["append_audio_chunk"],
    "input_audio_formats": ["pcm16", "pcm_f32le", "g711_ulaw", "g711_alaw"],
    "output_audio_formats": ["pcm16", {"type": "audio/pcm", "rate": OUT_RATE}, "g711_ulaw",
                             "g711_alaw"],
    "native_input_sample_rate": IN_RATE,
    "native_output_sample_rate": OUT_RATE,
    "instructions_mutable": False,
    "tools_mutable": False,
    "response_create": "unmutes output muted by response.cancel; otherwise no effect",
    "response_cancel": "ends the response and mutes output until response.create or commit",
}


# vllm-omni's duplex clients read these from `session.created`; they differ from its own
# server's on purpose in `supports_multi_session` (wave serves many sessions a GPU).
VLLM_OMNI_CAPABILITIES = {
    **CAPABILITIES,
    "supports_core_resumable_request": True,   # a dropped socket's session resumes by its id
    "supports_session_resume": True,
    "supports_client_commit": True,
    "supports_input_append": True,
    "supports_realtime_endpoint": True,
    "supports_playback_ack": False,
    "supports_audio_truncate": False,
    "supports_external_turn_signal": False,
    "supports_model_native_turn_policy": True,
}
FORMAT_NAMES = {"pcm_s16le": "pcm16", "pcm_f32le": "pcm_f32le", "pcmu": "g711_ulaw",
                "pcma": "g711_alaw"}


def parse_audio_format(value: Any, param: str) -> AudioSpec:
    """`"pcm16"`-style names (beta) or `{type, rate}` objects (GA); rate defaults per type."""
    if isinstance(value, str):
        if value in NAMED:
            return NAMED[value]
        if value in GA_TYPES:
            return GA_TYPES[value]
        raise EventError("invalid_value", f"{param}: unknown audio format {value!r}; use one of "
                         f"{sorted(NAMED)} or an object {{type, rate}}", param)
    if not isinstance(value, dict) or value.get("type") not in GA_TYPES:
        raise EventError("invalid_value", f"{param}: expected a format name or an object with "
                         f"type in {sorted(GA_TYPES)}", param)
    spec = GA_TYPES[value["type"]]
    rate = value.get("rate", spec.rate)
    if spec.fmt in ("pcmu", "pcma") and rate != 8000:
        raise EventError("invalid_value", f"{param}: G.711 is 8000 Hz only", param)
    if not isinstance(rate, int) or isinstance(rate, bool) or rate not in P.SAMPLE_RATES:
        raise EventError("invalid_value", f"{param}: rate must be one of {P.SAMPLE_RATES}", param)
    return AudioSpec(spec.fmt, rate)


def parse_tools(value: Any) -> tuple[dict, ...]:
    """OpenAI function tools -> the node's `{name, description, parameters}` maps."""
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise EventError("invalid_value", f"session.tools must be a list of at most {MAX_TOOLS} "
                         "tools", "session.tools")
    tools = []
    for i, tool in enumerate(value):
        param = f"session.tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise EventError("unsupported_tool_type", f"{param}: only function tools are "
                             "supported", param)
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise EventError("missing_required_parameter", f"{param}.name must be a non-empty "
                             "string", param)
        tools.append({"name": name, "description": str(tool.get("description", "")),
                      "parameters": tool.get("parameters", {"type": "object", "properties": {}})})
    return tuple(tools)


@dataclass(frozen=True)
class SessionConfig:
    """What one Realtime session asked for. Replaced whole by `apply_update`, never mutated."""
    instructions: str = ""
    tools: tuple[dict, ...] = ()
    input: AudioSpec = DEFAULT_AUDIO
    output: AudioSpec = DEFAULT_AUDIO
    voice: str = "default"                     # tolerated: the model has one voice
    modalities: tuple[str, ...] = ("audio", "text")   # tolerated: it always sends both


def apply_update(cfg: SessionConfig, s: Any, opened: bool) -> SessionConfig:
    """The config after `session.update` with session object `s`; `opened` freezes prompt/tools."""
    if not isinstance(s, dict):
        raise EventError("invalid_value", "session.update needs a `session` object", "session")
    new: dict[str, Any] = {}
    if "instructions" in s:
        if not isinstance(s["instructions"], str) or len(s["instructions"]) > P.MAX_INSTRUCTIONS:
            raise EventError("invalid_value", f"session.instructions must be a string of at most "
                             f"{P.MAX_INSTRUCTIONS} characters", "session.instructions")
        new["instructions"] = s["instructions"]
    if "tools" in s:
        new["tools"] = parse_tools(s["tools"])
    audio = s.get("audio") if isinstance(s.get("audio"), dict) else {}
    for key, beta_key, direction in (("input", "input_audio_format", "input"),
                                     ("output", "output_audio_format", "output")):
        ga = audio.get(direction) if isinstance(audio.get(direction), dict) else {}
        if "format" in ga:
            new[key] = parse_audio_format(ga["format"], f"session.audio.{direction}.format")
        elif beta_key in s:
            new[key] = parse_audio_format(s[beta_key], f"session.{beta_key}")
    voice = (audio.get("output") or {}).get("voice") if isinstance(audio.get("output"), dict) \
        else None
    voice = s.get("voice", voice)
    if voice is not None:
        new["voice"] = str(voice)
    modalities = s.get("output_modalities", s.get("modalities"))
    if isinstance(modalities, list):
        new["modalities"] = tuple(str(m) for m in modalities)
    if opened:
        for key in ("instructions", "tools"):
            if key in new and new[key] != getattr(cfg, key):
                raise EventError("immutable_session_field", f"session.{key} cannot change once "
                                 "the session has started: the model took them at prefill; open "
                                 "a new connection for new ones", f"session.{key}")
    return replace(cfg, **new)        # other fields (turn_detection, temperature ...) are ignored


def session_object(cfg: SessionConfig, session_id: str, beta: bool,
                   capabilities: dict = CAPABILITIES) -> dict:
    """The `session` field of `session.created`/`session.updated` in the connection's dialect."""
    tools = [{"type": "function", **t} for t in cfg.tools]
    common = {"id": session_id, "object": "realtime.session", "model": "nemotron-voicechat",
              "instructions": cfg.instructions, "tools": tools, "tool_choice": "auto",
              "capabilities": capabilities}
    if beta:
        # the beta models know only OpenAI's model names: ours is left out there
        del common["model"]
        return {**common, "modalities": ["audio", "text"], "voice": cfg.voice,
                "input_audio_format": cfg.input.beta(), "output_audio_format": cfg.output.beta(),
                "turn_detection": None, "input_audio_transcription": {"model": "rnnt"}}
    return {**common, "type": "realtime", "output_modalities": ["audio"],
            "audio": {"input": {"format": cfg.input.ga(), "turn_detection": None,
                                "transcription": {"model": "rnnt"}},
                      "output": {"format": cfg.output.ga(), "voice": cfg.voice}}}


def parse_event(text: str | bytes, max_chars: int) -> dict:
    """A client event from one WebSocket message: a JSON object with a string `type`."""
    if isinstance(text, bytes):
        raise EventError("invalid_event", "binary messages are not part of the protocol: send "
                         "JSON text events (audio goes base64 in input_audio_buffer.append)")
    if len(text) > max_chars:
        raise EventError("message_too_large", f"event of {len(text)} bytes exceeds the limit of "
                         f"{max_chars}; send audio in smaller appends")
    try:
        event = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise EventError("invalid_json", f"event is not valid JSON: {str(exc)[:200]}")
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise EventError("invalid_event", "an event must be a JSON object with a string `type`")
    return event
