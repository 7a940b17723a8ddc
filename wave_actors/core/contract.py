"""The executor contract: what the beat clock hands an executor (sim, cpu, graph, later wpk),
what it gets back, and the options every executor is built from.

A beat moves through preallocated host buffers only: the clock packs `BeatInput.audio` in place
(the executor's own ring, pinned on a GPU) and the executor fills `BeatOutput` in place, so the
hot path does no per-session allocation. Which slots run, start or reset is decided by the slot
book (`slot_book.BookPlan`), never by the executor, so every executor and the simulator follow
one start model. Sessions are named by `Handle` (slot, generation): a message that carries a
handle whose generation is not the slot's current one is stale and is rejected.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from wave_actors.core.frames import BEAT_S, FRAMES_PER_BEAT, SAMPLES_IN, SAMPLES_OUT

if TYPE_CHECKING:
    from wave_actors.core.sched.frame_places import FramesToRead
    from wave_actors.core.sched.slot_book import BookPlan
    from wave_actors.core.sched.start_shape import StartShape

MAX_USER_TOKENS = 10        # RNNT emits at most 10 symbols per frame (docs/MODEL.md §2.3)
NO_TOKEN = -1               # fill value of the user-transcript token slots


@dataclass
class SessionSpec:
    """What a session asks of the model when it opens: its system prompt and tool list."""
    instructions: str = ""
    tools: list[dict] = field(default_factory=list)


@dataclass
class BeatInput:
    """One beat's inputs for every slot; `live[s]` false means slot s is not in the beat."""
    audio: np.ndarray        # float32 [S, 2, 1280], 16 kHz in [-1, 1]
    live: np.ndarray         # bool [S]
    beat: int = 0            # beat sequence number (the doorbell value of a device mailbox)
    # Seconds this beat may take before it is late, less the clock's own work after the
    # executor returns (set by the clock when it plans the beat; a budgeted start policy judges
    # starts in it).
    time_left_s: float = BEAT_S
    # Set instead of `audio` being filled when the executor reads the frames where they lie
    # (`Capabilities.reads_frames`, with the engine's shared ring): `frames.rows(slots)`.
    frames: "FramesToRead | None" = None

    def rows(self, slots: np.ndarray) -> np.ndarray:
        """[len(slots), 2, SAMPLES_IN]: these slots' frames of the beat, wherever they lie."""
        return self.audio[slots] if self.frames is None else self.frames.rows(slots)

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
    compute_s: float = 0.0   # the executor's time for the whole beat (modelled for sim)

    @classmethod
    def alloc(cls, slots: int) -> "BeatOutput":
        return cls(np.zeros((slots, FRAMES_PER_BEAT, SAMPLES_OUT), np.float32),
                   np.zeros((slots, FRAMES_PER_BEAT), np.int32),
                   np.zeros((slots, FRAMES_PER_BEAT), np.int32),
                   np.full((slots, FRAMES_PER_BEAT, MAX_USER_TOKENS), NO_TOKEN, np.int32))


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


@dataclass(frozen=True, order=True)
class Handle:
    """A session's name inside the node: its slot and the generation the slot had when the
    session was admitted. Generations never repeat within a node (not across clock restarts
    either), so a handle outliving its session can never touch the slot's next session."""
    slot: int
    generation: int


@dataclass(frozen=True, kw_only=True)
class ExecutorOptions:
    """How an executor is built. Frozen: nothing changes after start."""
    max_sessions: int = 8               # slots; 0: a device executor sizes them itself
    profile: str = "reference"          # docs/MODEL.md §4 precision profile
    config: str = "tiny"                # model size for the cpu executor: tiny | full
    max_context: int = 1500             # frames of context each slot is sized for
    context_offset: int = 0             # sessions start as if they already held this context
    cost_model: str | None = None       # sim: JSON file of cost-model parameters
    checkpoint: str | None = None       # safetensors file with the real tensor names
    tokenizer: str | None = None        # tokenizer.json of the text tokenizer
    seed: int = 0
    context_roll: int = 0               # frames a session at max_context drops from its caches
                                        # to run on (0: `roll_frames` picks an eighth)
    beat_wait: str = "poll"             # graph: how the loop learns a beat is done (poll | thread)
    start_rows: int = 0                 # starting sessions a beat advances (0: the executor's)
    snapshot_mb: float = -1.0           # device memory for prompt snapshots (-1: the executor's
                                        # default, 0: none; every start then prefills)
    first_poll_ms: float = 0.0          # graph: frame 0's count polled every loop turn from
                                        # just before the fastest recent frame 0 (0), or
                                        # slept to it and polled every this many ms
    gpu_share: float = 1.0              # a device executor's share of its GPU (nodes sharing
                                        # one): its memory and beat are planned within it

    def __post_init__(self) -> None:
        if self.max_sessions < 0:
            raise ValueError("max_sessions must be at least 1, or 0 for a device executor to "
                             "size its slots")
        if not (self.snapshot_mb >= 0 or self.snapshot_mb == -1):
            raise ValueError(f"snapshot_mb {self.snapshot_mb}: -1 (the default), 0 (none) or more")
        if self.start_rows < 0:
            raise ValueError("start_rows must be 0 (the executor's default) or more")
        if not 0 < self.gpu_share <= 1:
            raise ValueError(f"gpu_share {self.gpu_share}: a share of one GPU, more than 0 and "
                             "at most 1")
        if not self.first_poll_ms >= 0:
            raise ValueError(f"first_poll_ms {self.first_poll_ms} must be 0 (poll every loop "
                             "turn) or a positive interval")
        if not 0 <= self.context_offset < self.max_context:
            raise ValueError(f"context_offset {self.context_offset} must be within max_context "
                             f"{self.max_context}")
        if self.frames_per_session < FRAMES_PER_BEAT:
            raise ValueError(f"max_context {self.max_context} must exceed context_offset "
                             f"{self.context_offset} by a beat ({FRAMES_PER_BEAT} frames)")
        if self.context_roll < 0 or self.context_roll % FRAMES_PER_BEAT \
                or self.context_roll > self.frames_per_session:
            raise ValueError(f"context_roll {self.context_roll} must be a multiple of "
                             f"{FRAMES_PER_BEAT} within the {self.frames_per_session} frames a "
                             "session may run")

    @property
    def frames_per_session(self) -> int:
        """Frames a session may run before its context is full (the offset is already held)."""
        return self.max_context - self.context_offset

    @property
    def roll_frames(self) -> int:
        """Frames a rolling session drops: `context_roll`, else an eighth of what it may run
        (whole beats, at least one). A larger roll moves cache rows less often; a smaller one
        keeps more of the window."""
        if self.context_roll:
            return self.context_roll
        eighth = self.frames_per_session // 8 // FRAMES_PER_BEAT * FRAMES_PER_BEAT
        return max(FRAMES_PER_BEAT, eighth)


def need_slots(options: "ExecutorOptions", name: str) -> int:
    """The slot count of an executor that does not size its own: options.max_sessions."""
    if options.max_sessions < 1:
        raise ValueError(f"the {name} executor needs a slot count (--max-sessions); only a "
                         "device executor sizes its own")
    return options.max_sessions


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What the clock and the tools may rely on, instead of asking an executor's name."""
    device: bool = False            # runs on a GPU (graph captures, memory ceiling, baseline)
    reports_launch: bool = False    # calls `on_launched` once the beat's device work is queued
    modelled_time: bool = False     # its time is a cost model slept on the node's clock (sim)
    # Reads a beat's frames from where they lie (`BeatInput.frames`) while the beat runs, as a
    # device reads host memory itself: the clock's loop does not gather them into `audio`.
    reads_frames: bool = False
    # Finishes a beat's frame 0 before its frame 1 (`wait_first`): the clock routes frame 0
    # while frame 1 computes, so the first 80 ms of output reach the clients that much sooner.
    first_frame: bool = False


@runtime_checkable
class Executor(Protocol):
    """Runs beats that the clock packed and the slot book planned. Contracts:

    - `submit` starts the beat's work for `plan` (its slots in `plan.roll` roll their caches
      first, its live rows read `inp.rows(plan.live)` (`inp.audio`, unless it
      `reads_frames`), its start rows prefill `plan.rows`, after the frames)
      and returns without waiting for it; `wait` returns once it is done (at once when no beat
      is in flight); `collect` then fills `out` (rows of `plan.live`) and returns the
      executor's time for the beat. One beat is in flight at a
      time; the clock may pack the next one meanwhile (into the other ring slot).
    - `alloc_output(into)` makes host buffers the caller owns (the engine's shared memory,
      `shared_outputs`) this executor's output buffers, which it then fills in place; without
      `into` it allocates its own. Writes to an output buffer begin only after `submit`.
    - An executor that `reads_frames` reads them before `collect` returns (the clock then
      counts those it found rewritten, `FramesToRead.torn`). An executor may keep `cpu_s`:
      the CPU seconds its own threads spent standing in for a device (the sim's hearing),
      reported apart from the clock's.
    - With `caps.first_frame`, `wait_first` returns once frame 0's outputs are in `out` (rows
      of `plan.live`, frame 0), before `wait` (at once when no beat is in flight, or when the
      beat ended without them: `wait` then raises what failed). Frame 0's rows are final then:
      whatever later writes them writes the same values.
    - `reset` forgets every slot's state (a clock restart: the new clock's book starts empty).
    - Outputs for the same inputs, seeds and weights equal the reference model's (sim excepted).
    """
    name: str
    caps: Capabilities
    options: ExecutorOptions
    max_sessions: int
    text_codec: "TextCodec"         # the thinker's text and function channels
    user_codec: "TextCodec"         # the RNNT's user-transcript tokens
    start_shape: "StartShape"       # how this executor's session starts are cut into rows
    on_launched: object             # set by the clock when caps.reports_launch

    def alloc_input(self) -> BeatInput: ...
    def alloc_output(self, into: BeatOutput | None = None) -> BeatOutput: ...
    def prompt_tokens(self, spec: SessionSpec) -> list[int]: ...
    def submit(self, plan: "BookPlan", inp: BeatInput, out: BeatOutput) -> None: ...
    async def wait(self) -> None: ...
    async def wait_first(self) -> None: ...     # only with caps.first_frame
    def collect(self, plan: "BookPlan", out: BeatOutput) -> float: ...
    def reset(self) -> None: ...
    def describe(self) -> dict: ...
    def close(self) -> None: ...
