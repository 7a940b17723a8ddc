"""The `sim` executor: no model, a cost model for time, synthetic but deterministic output.

Output is a function of (slot, frame index) only, so routing errors show: each slot speaks a tone
whose pitch encodes the slot (`tone_hz`), text tokens spell "slot N speaking. " in alternating
speaking/listening phases, the user channel transcribes a letter whenever the input frame has
energy, and a session opened with tools makes one function call early on. Time is the cost
model's `beat_time(live sessions, mean context, slots)`, at the bucket of the GPU executor's
ladder that holds the live sessions, slept on the node's clock (virtual in tests).

Session starts are the engine's: the clock's slot book plans them with the GPU executor's start
shape (`slot_book.StartShape`) and the node's start policy, exactly as for the engine. A beat
that carries start rows costs the cost model's `start_rows_s` more, or `small_rows_s` when the
start shape's small row capture holds them (the GPU replays the smallest capture that holds a
beat's rows and pays for all of its rows, used or padded). What the GPU executor measures at
build for a start policy (`start_row_s`: what each row capture adds; `beat_at_context_s`: the
beat at full context of one session and of the slots; the clock hands both to the policy's
`know_rows` / `know_beats`) the sim executor takes from the cost model (`measured_at_build`).

Prompt snapshots are the engine's too: the executor's `snapshot_space` is the GPU executor's
(`gpu/engine/snapshot_rows.space_for`) with the full model's snapshot sizes from the cost model
and `snapshot_mb` of its options (-1: the graph executor's 500 MB, 0: none), so the clock's slot
book starts a session from its prompt's snapshot where the engine's would. A beat pays the cost
model's `copy_s` a copy (and `copy_beat_s` once if it copies) and `save_s` a save
(`draw_beat`).
"""
from __future__ import annotations

import concurrent.futures
import functools
import json
import math
import random
import time
from dataclasses import asdict

import numpy as np

from sim.costmodel import SNAPSHOT_BYTES, CostModel
from wave_actors.core.contract import (NO_TOKEN, BeatInput, BeatOutput, ExecutorOptions,
                                       SessionSpec, need_slots)
from wave_actors.core.frames import (ALL_FRAMES, FIRST_FRAME, FRAMES_PER_BEAT, LATER_FRAMES, OUT_RATE,
                                     SAMPLES_IN, SAMPLES_OUT)
from wave_actors.core.prompt import fitted_prompt_tokens
from wave_actors.core.registry import REGISTRY
from wave_actors.core.sched.slot_book import BookPlan
from wave_actors.core.sched.start_shape import StartShape
from wave_actors.core.sched.snapshots import SnapshotSpace
from wave_actors.core.text import (CALL_END, CALL_START, PAD, ByteFallbackCodec,
                                   UserByteFallbackCodec)
from wave_actors.core.timebase import Clock

SPEAK_PERIOD = 50                # frames: 25 speaking, 25 listening
CALL_AT_FRAME = 4                # a session with tools starts its function call at this frame


def tone_hz(slot: int) -> float:
    return 200.0 + 25.0 * slot


def tone(slot: int, frame: int) -> np.ndarray:
    """Frame `frame` of slot's tone. Every slot's tone holds a whole number of cycles in a frame
    (16 + 2·slot at 22.05 kHz), so every frame is the same: computed once a slot (shared, not
    to be written to), which keeps the sim's output work small beside the clock's at 1,000
    sessions."""
    return _tone_frame(slot)


@functools.lru_cache(maxsize=4096)
def _tone_frame(slot: int) -> np.ndarray:
    n = np.arange(SAMPLES_OUT, dtype=np.float64)
    frame = (0.2 * np.sin(2 * math.pi * tone_hz(slot) * n / OUT_RATE)).astype(np.float32)
    frame.flags.writeable = False
    return frame


def snapshot_space(options: ExecutorOptions, cost: CostModel,
                   shape: StartShape) -> SnapshotSpace:
    """The prompt snapshots a GPU executor of these options would keep (`space_for`): rows of
    `shape.max_prompt` positions within `snapshot_mb` (-1: SNAPSHOT_BYTES; 0: none). The fast
    mode's book keeps the same, so its starts are the sim executor's."""
    capacity = SNAPSHOT_BYTES if options.snapshot_mb < 0 else options.snapshot_mb * 1e6
    fixed = int(cost.snapshot_fixed_bytes)
    per_position = int(cost.snapshot_bytes_per_position)
    entries = int(capacity // (fixed + per_position * shape.max_prompt)) if capacity > 0 else 0
    return SnapshotSpace(entries, capacity, fixed, per_position, f"sim:{options.profile}")


def measured_at_build(cost: CostModel, shape: StartShape, slots: int,
                      max_context: int) -> tuple[dict[int, float], dict[int, float]]:
    """What a GPU executor of `slots` slots measures at build for its start policy, from the
    cost model: (what each row capture adds to a beat, s: `start_row_s`; the beat at full
    context of one session and of every slot, s: `beat_at_context_s`). The fast mode hands
    the same to its policy, as the clock hands the executor's."""
    rows = {c: cost.rows_time(c, c, shape.start_rows) for c in shape.row_captures if c}
    beats = {n: cost.beat_time(n, max_context, slots) for n in sorted({1, max(1, slots)})}
    return rows, beats


HEARD_CHUNK = 32           # slots read at a time from the frames' ring: the rows stay in cache


def _heard(inp: BeatInput, live: np.ndarray) -> tuple[np.ndarray, float]:
    """[live, FRAMES_PER_BEAT] bool: each live slot's frames with an RMS over 0.01 (a sum of
    squares, without squaring into a copy of the audio; numpy lets go of the GIL for it), and
    the CPU seconds it took (the GPU's work, not the clock's). Packed audio is read in place
    when most slots are live; frames left in the ring are read a chunk of slots at a time."""
    t = time.thread_time()
    if inp.frames is None and 2 * len(live) >= len(inp.audio):
        energy = np.einsum("sfk,sfk->sf", inp.audio, inp.audio)[live]
    else:
        energy = np.empty((len(live), FRAMES_PER_BEAT), np.float32)
        for a in range(0, len(live), HEARD_CHUNK):
            rows = inp.rows(live[a:a + HEARD_CHUNK])
            energy[a:a + HEARD_CHUNK] = np.einsum("sfk,sfk->sf", rows, rows)
    return energy > 0.01 ** 2 * SAMPLES_IN, time.thread_time() - t


class SimExecutor:
    name = "sim"
    caps = REGISTRY["sim"].caps
    start_shape = StartShape()          # the GPU executor's: the sim's starts are the engine's
    on_launched = None

    def _rows_s(self, rows: int) -> float:
        """What `rows` start rows add to a beat: by the capture the GPU would replay."""
        return self.cost.rows_time(rows, self.start_shape.capture_for(rows),
                                   self.start_shape.start_rows)

    def __init__(self, options: ExecutorOptions, cost: CostModel | None = None,
                 clock: Clock | None = None, trace: bool = False):
        self.options = options
        self.max_sessions = need_slots(options, self.name)
        self.cost = cost or CostModel.load(options.cost_model, options.profile)
        offset = options.context_offset
        if offset and self.max_sessions > self.cost.capacity(offset):
            raise MemoryError(
                f"{self.max_sessions} sessions at {offset} frames of context need "
                f"{self.max_sessions * self.cost.state_bytes(offset) / 1e9:.1f} GB of state; "
                f"the modelled device holds {self.cost.capacity(offset)}")
        self.snapshot_space = snapshot_space(options, self.cost, self.start_shape)
        # what the GPU executor measures at build for the start policy (the clock reads them)
        self.start_row_s, self.beat_at_context_s = measured_at_build(
            self.cost, self.start_shape, self.max_sessions, options.max_context)
        self.clock = clock or Clock()
        self.text_codec = ByteFallbackCodec()
        self.user_codec = UserByteFallbackCodec()
        self._rng = random.Random(options.seed)
        self._func_queue: dict[int, list[int]] = {}     # slots with function tokens to say
        self._tones = np.stack([tone(slot, 0) for slot in range(self.max_sessions)]) \
            if self.max_sessions else np.zeros((0, SAMPLES_OUT), np.float32)
        # Every slot's phrase as a row of token ids (and its length): a beat's text tokens are
        # then one gather, not a Python call per slot and frame.
        phrases = [self.text_codec.encode(f"slot {slot} speaking. ")
                   for slot in range(self.max_sessions)]
        self._phrase_len = np.array([len(p) for p in phrases] or [1], np.int64)
        self._phrases = np.full((max(1, len(phrases)), int(self._phrase_len.max())), PAD,
                                np.int32)
        for slot, phrase in enumerate(phrases):
            self._phrases[slot, :len(phrase)] = phrase
        self._inflight: tuple[float, float] | None = None
        self._rolled = False                  # a beat of this executor rolled a context
        self._first: tuple | None = None      # (when frame 0 is done, its plan and outputs)
        self._hearer: concurrent.futures.ThreadPoolExecutor | None = None
        self._heard: concurrent.futures.Future | None = None
        # CPU seconds of the work that stands in for the GPU's (hearing), on the executor's
        # own thread: the engine process's time less this is the clock's.
        self.cpu_s = 0.0
        self.trace: list[tuple[int, int, float, float]] | None = [] if trace else None

    @classmethod
    def build(cls, options: ExecutorOptions, clock: Clock | None = None) -> "SimExecutor":
        return cls(options, CostModel.load(options.cost_model, options.profile), clock)

    def alloc_input(self) -> BeatInput:
        return BeatInput.alloc(self.max_sessions)

    def alloc_output(self, into: BeatOutput | None = None) -> BeatOutput:
        # A slot's audio is its tone whatever the frame: written once here, not every beat.
        out = into if into is not None else BeatOutput.alloc(self.max_sessions)
        out.pcm[:] = self._tones[:, None, :]
        return out

    def prompt_tokens(self, spec: SessionSpec) -> list[int]:
        return fitted_prompt_tokens(self.text_codec, spec.instructions, spec.tools,
                                    self.start_shape.max_prompt)

    def reset(self) -> None:
        self._func_queue = {}

    # -- the beat -------------------------------------------------------------------------------
    def _context(self, plan: BookPlan) -> float:
        held = plan.context
        return self.options.context_offset + (float(held.mean()) if len(held) else 0.0)

    def submit(self, plan: BookPlan, inp: BeatInput, out: BeatOutput) -> None:
        for slot, spec in plan.opened.items():
            call = self._call_of(spec)
            if call:
                self._func_queue[slot] = call
            else:
                self._func_queue.pop(slot, None)
        context = self._context(plan)
        rows, rolls = len(plan.rows), len(plan.roll)
        total = self.cost.draw_beat(len(plan.live), context, rows,
                                    self.start_shape.capture_for(rows),
                                    self.start_shape.start_rows, self._rng,
                                    resets=len(plan.resets), rolls=rolls,
                                    first_roll=not self._rolled, copies=len(plan.copies),
                                    saves=len(plan.saves), slots=self.max_sessions)
        self._rolled = self._rolled or rolls > 0
        live = np.asarray(plan.live, np.int64)
        if self.trace is not None:                 # what the executor was handed, at hand-over
            for slot, frames in zip(plan.live, inp.rows(live)):
                for a in frames:
                    self.trace.append((inp.beat, int(slot), float(a[0]), float(a[-1])))
        # What the user said is heard while the beat "runs", on a thread of the executor's, as
        # a GPU hears it beside the host (reading the frames from the ring itself, where they
        # were left there): the clock's loop does not read every frame again. The input
        # buffer is not packed again before this beat is collected.
        self._heard = self._hearing().submit(_heard, inp, live)
        now = self.clock.now()
        self._inflight = (now + total, total)
        self._first = (now + self.cost.first_frame_share * total, plan, out)

    def _hearing(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._hearer is None:
            self._hearer = concurrent.futures.ThreadPoolExecutor(1, "sim-hearing")
        return self._hearer

    async def wait(self) -> None:
        if self._inflight is not None:
            await self.clock.sleep_until(self._inflight[0])

    async def wait_first(self) -> None:
        """Frame 0 done at the cost model's `first_frame_share` of the beat."""
        if self._inflight is None or self._first is None:
            return
        at, plan, out = self._first
        await self.clock.sleep_until(at)
        if self._first is not None:
            self._first = None
            self._fill(plan, out, FIRST_FRAME)

    def collect(self, plan: BookPlan, out: BeatOutput) -> float:
        _end, total = self._inflight
        self._inflight = None
        self._fill(plan, out, ALL_FRAMES if self._first is not None else LATER_FRAMES)
        self._first = None
        return total

    def _fill(self, plan: BookPlan, out: BeatOutput, which: slice) -> None:
        """The model's outputs of frames `which` as arrays: a GPU writes them without the
        host's help, so the sim's share of the clock's loop stays small beside the clock's own
        at 1,000 sessions. The audio rows hold each slot's tone already (alloc_output)."""
        if not plan.live:
            return
        live = np.asarray(plan.live, np.int64)
        frames = np.asarray(plan.frame0[:len(live)], np.int64)[:, None] \
            + np.arange(FRAMES_PER_BEAT)[which]
        out.user[live, which] = NO_TOKEN
        heard, spent = self._heard.result()
        if which.start == 0:                    # the hearing is counted once a beat
            self.cpu_s += spent
        rows, cols = np.nonzero(heard[:, which])
        out.user[live[rows], which.start + cols, 0] = ord("a") + frames[rows, cols] % 26
        said = self._phrases[live[:, None], frames % self._phrase_len[live][:, None]]
        out.text[live, which] = np.where(frames % SPEAK_PERIOD >= SPEAK_PERIOD // 2, PAD, said)
        out.func[live, which] = PAD
        if self._func_queue:
            row = {slot: r for r, slot in enumerate(plan.live)}
            for slot in [s for s in self._func_queue if s in row]:
                self._say_call(slot, int(frames[row[slot], 0]), out, which)

    def _say_call(self, slot: int, first: int, out: BeatOutput, which: slice) -> None:
        """The slot's next function-channel tokens, one a frame from CALL_AT_FRAME on; `first`
        is the number of frame `which.start`."""
        queue = self._func_queue[slot]
        for f in range(which.start, which.stop):
            if queue and first + f - which.start >= CALL_AT_FRAME:
                out.func[slot, f] = queue.pop(0)
        if not queue:
            del self._func_queue[slot]

    def _call_of(self, spec: SessionSpec | None) -> list[int]:
        if spec is None or not spec.tools:
            return []
        call = [{"name": spec.tools[0]["name"], "arguments": {}}]
        text = "<TOOLCALL>" + json.dumps(call) + "</TOOLCALL>"
        return [CALL_START] + self.text_codec.encode(text) + [CALL_END]

    def describe(self) -> dict:
        return {"backend": self.name, "max_sessions": self.max_sessions,
                "start_shape": asdict(self.start_shape),
                "snapshots": {"entries": self.snapshot_space.entries,
                              "capacity_bytes": int(self.snapshot_space.capacity_bytes)},
                "cost_model": {"profile_bytes_per_session_at_1500": self.cost.session_bytes(1500),
                               "beat_ms_at_max": 1000 * self.cost.beat_time(self.max_sessions,
                                                                            1500)},
                "start_row_ms": {c: round(1e3 * s, 2) for c, s in self.start_row_s.items()},
                "beat_ms_at_context": {n: round(1e3 * s, 2)
                                       for n, s in self.beat_at_context_s.items()}}

    def close(self) -> None:
        if self._hearer is not None:
            self._hearer.shutdown(wait=True)
            self._hearer = None
