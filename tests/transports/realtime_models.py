"""The `openai` SDK's own pydantic models of Realtime server events, by event type, for both
dialects: what a client built on the SDK parses every event the bridge sends with."""
from __future__ import annotations

import functools
import typing

from pydantic import TypeAdapter, ValidationError


def _by_type(union) -> dict[str, type]:
    """Each member model of the SDK's server-event union, keyed by its `type` literal."""
    while typing.get_origin(union) is typing.Annotated:
        union = typing.get_args(union)[0]
    models = {}
    for model in typing.get_args(union):
        literal = model.model_fields["type"].annotation
        for name in typing.get_args(literal):
            models[name] = model
    return models


@functools.cache
def models(dialect: str) -> dict[str, type]:
    """The SDK's server-event models of a dialect, imported at first use: the SDK's unions take
    over a second to import, which every test worker would otherwise pay at collection."""
    if dialect == "ga":
        from openai.types.realtime.realtime_server_event import RealtimeServerEvent
    elif dialect == "beta":
        from openai.types.beta.realtime.realtime_server_event import RealtimeServerEvent
    else:
        raise ValueError(f"no Realtime dialect {dialect!r} (ga or beta)")
    return _by_type(RealtimeServerEvent)


def problems(event: dict, dialect: str) -> str | None:
    """Why the SDK's model for this event's type rejects it (None: it validates); an event type
    the SDK does not know is a problem too."""
    model = models(dialect).get(event.get("type"))
    if model is None:
        return f"{event.get('type')!r} is not a {dialect} server event the SDK knows"
    try:
        TypeAdapter(model).validate_python(event)
    except ValidationError as exc:
        return f"{event['type']}: {exc}"
    return None
