"""Node events -> Realtime server events: the response and item lifecycle of a duplex stream.

The node streams one output frame every 80 ms for as long as the session lives; the Realtime
dialect speaks in responses and items. The mapping: the output stream is cut into consecutive
responses, each holding one assistant audio message (output_index 0) and any function calls.
A response opens at the first output frame after the previous one ended and ends when
  - the model calls a function (the call is its last item; status "completed"),
  - the agent's transcript has been quiet for `turn_gap_frames` after it spoke (status "completed"),
  - the client cancels it (status "cancelled"; output is then muted until `resume`), or
  - the session closes (status "incomplete").
User audio forms user items the same way: one opens with the first input after the last one
closed and closes on `commit` or after `turn_gap_frames` of transcript quiet.

Invariants (tests/test_realtime_events.py checks them on random event sequences):
  every delta lies between its response's `response.created` and `response.done`; at most one
  response is open; every `response.created` is matched by one `response.done`; no audio or agent
  text is emitted while muted; every server event has a unique `event_id`.
Pure: no I/O, no clock (time is the node's frame index).
"""
from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field

AUDIO_DELTA = "response.output_audio.delta"
FRAME_S = 0.08                  # a node frame
# The beta dialect's names for the GA ones; None: the beta dialect has no such event.
BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "conversation.item.added": "conversation.item.created",
    "conversation.item.done": None,
}
AUDIO_DELTA_TYPES = frozenset({AUDIO_DELTA, BETA_NAMES[AUDIO_DELTA]})


class Ids:
    """Server-side ids: `<kind>_<connection prefix><counter>`, unique within the process run."""

    def __init__(self, prefix: str | None = None):
        self.prefix, self.n = prefix or os.urandom(4).hex(), 0

    def __call__(self, kind: str) -> str:
        self.n += 1
        return f"{kind}_{self.prefix}{self.n:x}"


@dataclass
class _Text:
    """A transcript being accumulated; stored up to `cap` chars (deltas beyond still go out)."""
    cap: int
    parts: list[str] = field(default_factory=list)
    size: int = 0
    last_frame: int | None = None      # node frame of the latest delta; None: nothing said yet

    def add(self, text: str, frame: int) -> None:
        if self.size < self.cap:
            self.parts.append(text[: self.cap - self.size])
            self.size += len(self.parts[-1])
        self.last_frame = frame

    def quiet_since(self, frame: int, gap: int) -> bool:
        return self.last_frame is not None and frame - self.last_frame >= gap

    def __str__(self) -> str:
        return "".join(self.parts)


@dataclass
class _Response:
    id: str
    item_id: str                       # the assistant audio message, output_index 0
    transcript: _Text
    output: list[dict] = field(default_factory=list)     # finished items, in output_index order
    message_open: bool = True
    spoke: bool = False                # `response.speak` sent (the vllm-omni dialect's)


@dataclass
class _UserItem:
    id: str
    transcript: _Text
    opened: int = 0                 # the node frame the item opened at (its audio's start)


class Conversation:
    def __init__(self, beta: bool = False, ids: Ids | None = None, turn_gap_frames: int = 10,
                 max_transcript: int = 16384, vllm_omni: bool = False):
        self.beta, self.ids = beta or vllm_omni, ids or Ids()
        # vllm-omni's extensions: `response.speak` before a response's first audio, and
        # `audio_fields` (the delta's format and rate) on every audio delta
        self.vllm_omni = vllm_omni
        self.audio_fields: dict = {}
        self.turn_gap_frames, self.max_transcript = turn_gap_frames, max_transcript
        self.response: _Response | None = None
        self.user: _UserItem | None = None
        self.muted = False
        self.muted_frames = 0           # output frames not sent because the client cancelled
        self.last_item: str | None = None   # previous_item_id of the next item added
        self.frame = 0                  # the latest node frame seen: the input's clock

    # ---- event construction -------------------------------------------------------------

    def event(self, type_: str, **fields) -> list[dict]:
        """One server event in this connection's dialect ([] where the dialect has none)."""
        if self.beta:
            type_ = BETA_NAMES.get(type_, type_)
            if type_ is None:
                return []
        return [{"type": type_, "event_id": self.ids("event"), **fields}]

    def error(self, code: str, message: str, client_event_id: str | None = None,
              param: str | None = None, kind: str = "invalid_request_error") -> list[dict]:
        return self.event("error", error={"type": kind, "code": code, "message": message,
                                          "param": param, "event_id": client_event_id})

    # ---- node -> client -------------------------------------------------------------------

    def audio(self, frame: int, payload: bytes) -> list[dict]:
        """One output frame (already in the client's format). Also the clock of turn gaps."""
        self.frame = max(self.frame, frame)
        out = self._tick(frame)
        if self.muted:
            self.muted_frames += 1
            return out
        if not payload:
            return out
        out += self._open_response()
        r = self.response
        if self.vllm_omni and not r.spoke:
            r.spoke = True
            out += self.event("response.speak", **self._where(r, 0),
                              metadata={"model_speak": True})
        return out + self.event(AUDIO_DELTA, **self._where(r, 0),
                                delta=base64.b64encode(payload).decode("ascii"),
                                **self.audio_fields)

    def agent_text(self, frame: int, text: str) -> list[dict]:
        if self.muted or not text:
            return []
        out = self._open_response()
        r = self.response
        r.transcript.add(text, frame)
        return out + self.event("response.output_audio_transcript.delta", **self._where(r, 0),
                                delta=text)

    def user_text(self, frame: int, text: str) -> list[dict]:
        if not text:
            return []
        self.note_input()
        self.user.transcript.add(text, frame)
        return self.event("conversation.item.input_audio_transcription.delta",
                          item_id=self.user.id, content_index=0, delta=text)

    def function_call(self, call_id: str, name: str, arguments: str) -> list[dict]:
        """A call ends its response: the client answers it, then the model goes on."""
        out = self._open_response()
        r = self.response
        out += self._close_message(r, "completed")
        item = {"id": self.ids("item"), "object": "realtime.item", "type": "function_call",
                "status": "in_progress", "call_id": call_id, "name": name, "arguments": ""}
        where = {"response_id": r.id, "item_id": item["id"], "output_index": len(r.output)}
        out += self.event("response.output_item.added", response_id=r.id,
                          output_index=len(r.output), item=item)
        out += self._item_added(item)
        out += self.event("response.function_call_arguments.delta", **where, call_id=call_id,
                          delta=arguments)
        out += self.event("response.function_call_arguments.done", **where, call_id=call_id,
                          name=name, arguments=arguments)
        done = {**item, "status": "completed", "arguments": arguments}
        out += self.event("response.output_item.done", response_id=r.id,
                          output_index=len(r.output), item=done)
        out += self.event("conversation.item.done", item=done)
        r.output.append(done)
        return out + self._close_response("completed", None)

    def closed(self) -> list[dict]:
        """The node closed the session: finish what is open (the API names no reason for a
        response cut short by its session's end: "incomplete" without one)."""
        out = []
        if self.response:
            out += self._close_response("incomplete", {"type": "incomplete"})
        if self.user:
            out += self._close_user()
        return out

    # ---- client -> conversation -----------------------------------------------------------

    def cancel(self) -> list[dict]:
        """`response.cancel`: end the open response and mute output until `resume`."""
        self.muted = True
        if self.response is None:
            return []
        return self._close_response("cancelled", {"type": "cancelled",
                                                  "reason": "client_cancelled"})

    def resume(self) -> None:
        self.muted = False

    def note_input(self) -> None:
        """Input audio or transcript arrived: make sure a user item is open to hold it."""
        if self.user is None:
            self.user = _UserItem(self.ids("item"), _Text(self.max_transcript), self.frame)

    def commit(self) -> list[dict] | None:
        """`input_audio_buffer.commit`: close the user item; None if there was no input."""
        if self.user is None:
            return None
        item_id, previous = self.user.id, self.last_item
        out = self.event("input_audio_buffer.committed", previous_item_id=previous,
                         item_id=item_id)
        return out + self._close_user()

    # ---- internals ------------------------------------------------------------------------

    def _where(self, r: _Response, output_index: int) -> dict:
        return {"response_id": r.id, "item_id": r.item_id, "output_index": output_index,
                "content_index": 0}

    def _part(self, transcript: str) -> dict:
        """A `response.content_part.*` event's part (both dialects call it "audio")."""
        return {"type": "audio", "transcript": transcript}

    def _content(self, transcript: str) -> dict:
        """An assistant message item's content (GA: "output_audio"; beta: "audio")."""
        return {"type": "audio" if self.beta else "output_audio", "transcript": transcript}

    def _message(self, r: _Response, status: str) -> dict:
        content = [] if status == "in_progress" else [self._content(str(r.transcript))]
        return {"id": r.item_id, "object": "realtime.item", "type": "message",
                "role": "assistant", "status": status, "content": content}

    def _item_added(self, item: dict) -> list[dict]:
        out = self.event("conversation.item.added", previous_item_id=self.last_item, item=item)
        self.last_item = item["id"]
        return out

    def _tick(self, frame: int) -> list[dict]:
        out = []
        r, gap = self.response, self.turn_gap_frames
        if r is not None and r.transcript.quiet_since(frame, gap):
            out += self._close_response("completed", None)
        if self.user is not None and self.user.transcript.quiet_since(frame, gap):
            out += self._close_user()
        return out

    def _open_response(self) -> list[dict]:
        if self.response is not None:
            return []
        r = self.response = _Response(self.ids("resp"), self.ids("item"),
                                      _Text(self.max_transcript))
        out = self.event("response.created", response=self._response_obj(r, "in_progress", None))
        item = self._message(r, "in_progress")
        out += self.event("response.output_item.added", response_id=r.id, output_index=0,
                          item=item)
        out += self._item_added(item)
        return out + self.event("response.content_part.added", **self._where(r, 0),
                                part=self._part(""))

    def _close_message(self, r: _Response, status: str) -> list[dict]:
        if not r.message_open:
            return []
        r.message_open = False
        where, text = self._where(r, 0), str(r.transcript)
        out = self.event("response.output_audio.done", **where)
        out += self.event("response.output_audio_transcript.done", **where, transcript=text)
        out += self.event("response.content_part.done", **where, part=self._part(text))
        item = self._message(r, status)
        out += self.event("response.output_item.done", response_id=r.id, output_index=0,
                          item=item)
        out += self.event("conversation.item.done", item=item)
        r.output.insert(0, item)
        return out

    def _close_response(self, status: str, details: dict | None) -> list[dict]:
        r, self.response = self.response, None
        out = self._close_message(r, "completed" if status == "completed" else "incomplete")
        return out + self.event("response.done", response=self._response_obj(r, status, details))

    def _response_obj(self, r: _Response, status: str, details: dict | None) -> dict:
        return {"id": r.id, "object": "realtime.response", "status": status,
                "status_details": details, "output": list(r.output), "usage": None,
                "output_modalities": ["audio"], "modalities": ["audio", "text"]}

    def _close_user(self) -> list[dict]:
        u, self.user = self.user, None
        text = str(u.transcript)
        item = {"id": u.id, "object": "realtime.item", "type": "message", "role": "user",
                "status": "completed", "content": [{"type": "input_audio", "transcript": text}]}
        out = self._item_added(item)
        out += self.event("conversation.item.done", item=item)
        # usage: the item's audio, by the node frames it spans (the model bills no tokens)
        seconds = max(0, self.frame - u.opened) * FRAME_S
        return out + self.event("conversation.item.input_audio_transcription.completed",
                                item_id=u.id, content_index=0, transcript=text,
                                usage={"type": "duration", "seconds": round(seconds, 2)})
