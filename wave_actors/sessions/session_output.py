"""A session's outbound side, frame by frame of the beats the clock hands it: the speech
resampled from 22.05 kHz to the client's rate and re-cut to one 80 ms frame per `audio`
message; text and user-transcript tokens decoded incrementally into `text` deltas;
function-channel tokens parsed into `function_call`s (a malformed one is told as an error).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from transports import audio as A
from transports import protocol as P
from wave_actors.core.contract import NO_TOKEN, TextCodec
from wave_actors.core.frames import OUT_RATE
from wave_actors.core.function_calls import FunctionCallParser
from wave_actors.core.text import TextStream
from wave_actors.sessions.messages import SessionConfig, SessionCounters


class SessionOutput:
    def __init__(self, cfg: SessionConfig, send: Callable[..., bool], text_codec: TextCodec,
                 user_codec: TextCodec, counters: SessionCounters):
        # No callback into the session: a bound method of it here would be a reference cycle,
        # keeping a closed session until a full collection.
        self.cfg, self._send, self._counters = cfg, send, counters
        # A session worker's send can take an `audio` message's samples unencoded: it encodes
        # those of all its sessions of one format in one array operation a flush.
        self._send_pcm = getattr(send, "pcm", None)
        self._resampler = A.StreamResampler(OUT_RATE, cfg.output_sample_rate)
        self._pending = np.zeros(0, np.float32)
        self._frame_len = cfg.output_sample_rate * 80 // 1000
        self.seq = 0                    # of the next `audio` message
        self._agent_text = TextStream(text_codec)
        self._user_text = TextStream(user_codec)
        self._calls = FunctionCallParser(text_codec, cfg.session)

    def frame(self, frame: int, pcm: np.ndarray, text_token: int, user_tokens: list[int],
              func_token: int) -> None:
        """The model's outputs of one frame, sent to the client."""
        self._audio(frame, self._resampler(pcm))
        self._text(frame, text_token, user_tokens)
        for call in self._calls.push(func_token):
            self._send(P.pack("function_call", self.cfg.session, call_id=call.call_id,
                              name=call.name, arguments=call.arguments))
        for problem in self._calls.take_errors():
            self._send(P.error_frames("bad_function_call", problem, self.cfg.session))

    def _audio(self, frame: int, x: np.ndarray) -> None:
        """Exactly one 80 ms frame per `audio` message at the output rate: a resampler's chunks
        vary in length, so its output is re-cut (the first frame waits out its latency)."""
        self._pending = np.concatenate([self._pending, x]) if len(self._pending) else x
        while len(self._pending) >= self._frame_len:
            chunk = self._pending[:self._frame_len]
            self._pending = self._pending[self._frame_len:]
            header = P.pack("audio", self.cfg.session, seq=self.seq, frame=frame)
            if self._send_pcm is not None:        # a worker's: encoded with its others
                ok = self._send_pcm(header, chunk, self.cfg.output_format)
            else:
                ok = self._send([*header, A.encode(chunk, self.cfg.output_format)], True)
            self.seq += 1
            if ok:
                self._counters.frames_sent += 1
            else:
                self._counters.dropped_out += 1

    def _text(self, frame: int, text_token: int, user_tokens: list[int]) -> None:
        agent = self._agent_text.push([text_token])
        if agent:
            self._send(P.pack("text", self.cfg.session, channel="agent", frame=frame,
                              text=agent))
        user = self._user_text.push([t for t in user_tokens if t != NO_TOKEN])
        if user:
            self._send(P.pack("text", self.cfg.session, channel="user", frame=frame,
                              text=user))
