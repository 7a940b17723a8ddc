"""The one interface every backend (sim, cpu, graph, wpk) implements, and the buffers it shares.

A beat moves through preallocated host buffers only: the clock packs `BeatInput.audio` in place
and the backend fills `BeatOutput` in place, so the hot path does no per-session allocation. On a
GPU machine the backend allocates these buffers in pinned memory (`alloc_input`/`alloc_output`);
the clock never imports torch.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from wave_actors.frames import BEAT_S, FRAMES_PER_BEAT, SAMPLES_IN, SAMPLES_OUT

MAX_USER_TOKENS = 10        # RNNT emits at most 10 symbols per frame (MODEL.md §2.3)
NO_TOKEN = -1               # fill value of the user-transcript token slots


@dataclass
class SessionSpec:
    """What a session asks of the model when it opens: its system prompt and tool list."""
    instructions: str = ""
    tools: list[dict] = field(default_factory=list)


@dataclass
class BeatInput:
    """One beat's inputs for every slot; `live[s]` false means slot s is masked out."""
    audio: np.ndarray        # float32 [S, 2, 1280], 16 kHz in [-1, 1]
    live: np.ndarray         # bool [S]
    beat: int = 0            # beat sequence number (the doorbell value of GPU backends)
    # Seconds this beat may take before it is late, less the clock's own work after the backend
    # returns (set by the clock at the call). A backend fits optional work (session starts) in it.
    time_left_s: float = BEAT_S

    @classmethod
    def alloc(cls, slots: int) -> "BeatInput":
        return cls(np.zeros((slots, FRAMES_PER_BEAT, SAMPLES_IN), np.float32),
                   np.zeros(slots, bool))


@dataclass
class BeatOutput:
    """One beat's outputs for every slot. Rows of slots that were not live are undefined."""
    pcm: np.ndarray          # float32 [S, 2, 1764], 22.05 kHz
    text: np.ndarray         # int32 [S, 2]: the agent's text token per frame
    func: np.ndarray         # int32 [S, 2]: the function-channel token per frame
    user: np.ndarray         # int32 [S, 2, 10]: user-transcript tokens, NO_TOKEN padded
    compute_s: float = 0.0   # time the backend spent on the beat (modelled for sim)

    @classmethod
    def alloc(cls, slots: int) -> "BeatOutput":
        return cls(np.zeros((slots, FRAMES_PER_BEAT, SAMPLES_OUT), np.float32),
                   np.zeros((slots, FRAMES_PER_BEAT), np.int32),
                   np.zeros((slots, FRAMES_PER_BEAT), np.int32),
                   np.full((slots, FRAMES_PER_BEAT, MAX_USER_TOKENS), NO_TOKEN, np.int32))


class StartRefused(Exception):
    """The backend gave up starting a session (no room on the device); the message says why."""


class TextCodec(abc.ABC):
    """Turns token ids into text and back; the node decodes streams per session with it."""
    pad_id: int = 12
    bos_id: int = 1
    eos_id: int = 2
    silence_ids: frozenset[int] = frozenset({11, 12})

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]: ...

    @abc.abstractmethod
    def decode_bytes(self, ids: list[int]) -> bytes:
        """UTF-8 bytes of `ids`; control and silence tokens decode to nothing."""


class Backend(abc.ABC):
    """Advances every live slot by one beat (two frames). Contracts:

    - `open_slot` resets the slot's state and starts its prefill; the slot reports `ready` once
      the prefill is done (in bounded chunks inside later beats, never one long blocking step).
      Until then the clock sends it no audio and emits silence for it.
    - `run_beat` never waits on a client and never touches a slot that is not live.
    - `close_slot` frees the slot; its state may be reused by the next `open_slot`.
    - Outputs for the same inputs, seeds and weights equal the reference model's (sim excepted).
    """
    name: str = "?"
    max_sessions: int
    # A backend whose beat leaves the host free once its device work is queued calls
    # `on_launched()` (set by the clock) then, from the loop's thread; others never call it.
    reports_launch: bool = False
    on_launched: Callable[[], None] | None = None
    text_codec: TextCodec       # the thinker's text and function channels
    user_codec: TextCodec       # the RNNT's user-transcript tokens

    def alloc_input(self) -> BeatInput:
        return BeatInput.alloc(self.max_sessions)

    def alloc_output(self) -> BeatOutput:
        return BeatOutput.alloc(self.max_sessions)

    @abc.abstractmethod
    def open_slot(self, slot: int, spec: SessionSpec) -> None: ...

    @abc.abstractmethod
    def close_slot(self, slot: int) -> None: ...

    @abc.abstractmethod
    def ready(self, slot: int) -> bool:
        """True once the slot's prefill has finished and it can take audio."""

    def start_refused(self, slot: int) -> str | None:
        """Why the backend gave up starting this slot, or None (starting, ready, or closed). A
        refused slot never becomes ready; the node answers its opener `refused` and closes it."""
        return None

    def push_function_tokens(self, slot: int, ids: list[int]) -> None:
        """Queue a tool result's tokens to be forced into the slot's function channel, one token
        per frame (with the text channel forced to PAD meanwhile, MODEL.md §6)."""
        raise NotImplementedError(f"backend {self.name} does not take function results")

    @abc.abstractmethod
    async def run_beat(self, inp: BeatInput, out: BeatOutput) -> BeatOutput:
        """Run one beat for `inp.live` slots, writing into `out` (and returning it)."""

    def describe(self) -> dict:
        """Facts printed at start: capacity, profile, memory."""
        return {"backend": self.name, "max_sessions": self.max_sessions}

    def close(self) -> None:
        pass
