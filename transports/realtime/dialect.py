"""Which Realtime dialect a connection speaks, from what its client sent in the handshake.

- GA (the default): the OpenAI Realtime API's GA event names and session shape.
- beta: the beta API's names (`response.audio.delta`, ...) and session shape, on
  `?dialect=beta`, an `OpenAI-Beta: realtime=v1` header or the `openai-beta.realtime-v1`
  subprotocol (what the SDK's beta client sends).
- vllm-omni: vllm-omni's full-duplex Realtime protocol (its `RealtimeDuplexClient`), on
  `?duplex=1` or `?dialect=vllm-omni`: the beta names, plus `sample_rate_hz` and `format` on
  audio deltas, one delta per 80 ms model frame, `response.speak` before a response's first
  audio, `session.close` answered by `session.closed`, and its `autostart` and `session_id`
  query parameters. Events outside the OpenAI API go only to this dialect.
"""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from websockets.datastructures import Headers

TRUE = ("1", "true", "yes", "on")
DIALECTS = ("ga", "beta", "vllm-omni")


@dataclass(frozen=True)
class Dialect:
    beta: bool = False              # beta event names and session shape
    vllm_omni: bool = False         # vllm-omni's duplex events and query semantics
    autostart: bool = True          # vllm-omni: open the session at connect (`autostart=0`: not)
    session_id: str | None = None   # vllm-omni: the session's name, to resume it by

    @property
    def name(self) -> str:
        return "vllm-omni" if self.vllm_omni else "beta" if self.beta else "ga"


class DialectError(ValueError):
    pass


def dialect_of(path: str, headers: Headers) -> Dialect:
    """The dialect a handshake asks for; `DialectError` names what is wrong with the ask."""
    query = parse_qs(urlsplit(path).query)

    def one(name: str) -> str | None:
        values = query.get(name)
        return values[-1] if values else None
    asked = one("dialect")
    if asked is not None and asked not in DIALECTS:
        raise DialectError(f"dialect {asked!r} is not one of {', '.join(DIALECTS)}")
    duplex = (one("duplex") or "").lower() in TRUE
    if asked == "vllm-omni" or (asked is None and duplex):
        session_id = one("session_id")
        if session_id is not None and not (0 < len(session_id) <= 128 and session_id.isprintable()):
            raise DialectError("session_id must be 1 to 128 printable characters")
        autostart = (one("autostart") or "1").lower() in TRUE and \
            (one("resume") or "0").lower() not in TRUE
        return Dialect(beta=True, vllm_omni=True, autostart=autostart, session_id=session_id)
    if asked is not None:
        return Dialect(beta=asked == "beta")
    protos = ",".join(headers.get_all("Sec-WebSocket-Protocol"))
    return Dialect(beta="realtime=v1" in headers.get("OpenAI-Beta", "")
                   or "openai-beta.realtime-v1" in protos)
