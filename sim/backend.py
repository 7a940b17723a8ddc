"""The `sim` backend: no model, a cost model for time, synthetic but deterministic output.

Output is a function of (slot, frame index) only, so routing errors show: each slot speaks a tone
whose pitch encodes the slot (`tone_hz`), text tokens spell "slot N speaking. " in alternating
speaking/listening phases, the user channel transcribes a letter whenever the input frame has
energy, and a session opened with tools makes one function call early on. Time is the cost
model's `beat_time(live sessions, mean context)`, slept on the node's clock (virtual in tests).

Session starts follow the engine's policy (gpu/engine/start_budget.py): start steps of up to 16
slots, as many in a beat as its time left holds with the live cost and a margin, the slots with
the fewest steps first; a start that finds no room `give_up` beats in a row is refused. A step
costs its slots' share of a beat in the cost model, plus the model's `start_step_s`.
"""
from __future__ import annotations

import json
import math

import numpy as np

from gpu.model.tokenizer import (CALL_END, CALL_START, PAD, ByteFallbackCodec,
                                 UserByteFallbackCodec)
from gpu.engine.start_budget import StartBudget, StartQueue
from sim.costmodel import CostModel
from wave_actors.backend import Backend, BeatInput, BeatOutput, NO_TOKEN, SessionSpec
from wave_actors.clocks import Clock
from wave_actors.frames import FRAMES_PER_BEAT, OUT_RATE, SAMPLES_OUT

PREFILL_TOKENS_PER_BEAT = 256    # prompt positions a slot prefills per beat (bounded chunks)
STARTS_PER_STEP = 16             # starting slots one start step advances (the graph engine's)
SPEAK_PERIOD = 50                # frames: 25 speaking, 25 listening
CALL_AT_FRAME = 4                # a session with tools starts its function call at this frame


def tone_hz(slot: int) -> float:
    return 200.0 + 25.0 * slot


def tone(slot: int, frame: int) -> np.ndarray:
    n = np.arange(frame * SAMPLES_OUT, (frame + 1) * SAMPLES_OUT, dtype=np.float64)
    return (0.2 * np.sin(2 * math.pi * tone_hz(slot) * n / OUT_RATE)).astype(np.float32)


class SimBackend(Backend):
    name = "sim"

    def __init__(self, max_sessions: int, cost: CostModel | None = None, clock: Clock | None = None,
                 context_offset: int = 0, seed: int = 0, trace: bool = False,
                 context_hold: int = 0):
        self.max_sessions = max_sessions
        self.cost = cost or CostModel.load()
        if context_offset and max_sessions > self.cost.capacity(context_offset):
            raise MemoryError(
                f"{max_sessions} sessions at {context_offset} frames of context need "
                f"{max_sessions * self.cost.state_bytes(context_offset) / 1e9:.1f} GB of state; "
                f"the modelled device holds {self.cost.capacity(context_offset)}")
        self.clock = clock or Clock()
        self.context_offset = context_offset        # pretend every session already has this context
        self.context_hold = context_hold            # >0: context cycles offset .. offset + hold, as
                                                    # the engine's BackendOptions.context_hold does
        self.text_codec = ByteFallbackCodec()
        self.user_codec = UserByteFallbackCodec()
        self._rng = np.random.default_rng(seed)
        self._frame = np.zeros(max_sessions, np.int64)          # frames run since open
        self._prefill_left = np.zeros(max_sessions, np.int64)   # prompt positions still to prefill
        self._func_queue: list[list[int]] = [[] for _ in range(max_sessions)]
        self.start_budget: StartBudget | None = StartBudget()   # None: starts advance every beat
        self._starts = StartQueue()
        self._live = np.zeros(max_sessions, bool)         # start done and gone live
        self.trace: list[tuple[int, int, float, float]] | None = [] if trace else None

    def open_slot(self, slot: int, spec: SessionSpec) -> None:
        self._frame[slot] = 0
        self._prefill_left[slot] = len(self.text_codec.encode(spec.instructions)) + 2
        self._live[slot] = False
        self._starts.open(slot)
        self._func_queue[slot] = []
        if spec.tools:
            call = [{"name": spec.tools[0]["name"], "arguments": {}}]
            text = "<TOOLCALL>" + json.dumps(call) + "</TOOLCALL>"
            self._func_queue[slot] = [CALL_START] + self.text_codec.encode(text) + [CALL_END]

    def close_slot(self, slot: int) -> None:
        self._prefill_left[slot] = 0
        self._live[slot] = False
        self._starts.close(slot)
        self._func_queue[slot] = []

    def ready(self, slot: int) -> bool:
        return bool(self._live[slot])

    def start_refused(self, slot: int) -> str | None:
        return self._starts.refused(slot)

    def push_function_tokens(self, slot: int, ids: list[int]) -> None:
        self._func_queue[slot] = self._func_queue[slot] + list(ids)

    def _start_steps(self, n_live: int, time_left_s: float, context: float) -> float:
        """This beat's start steps, as the engine runs them (`StartQueue`): each advances its
        slots' prefill by one chunk and costs its slots' share of a beat plus `start_step_s`.
        Returns their modelled cost; the finished starts the budget lets go live do."""
        total, budget = 0.0, self.start_budget
        for group in self._starts.plan(n_live, time_left_s, budget, STARTS_PER_STEP):
            self._prefill_left[group] -= PREFILL_TOKENS_PER_BEAT
            for slot in group:
                if self._prefill_left[slot] <= 0:
                    self._starts.finished(slot)
            # its slots' share of a beat, and the step's own fixed cost (the engine's step is
            # an eager pass of its own, whatever the live load)
            cost = (self.cost.beat_time(1 + len(group), context)
                    - self.cost.beat_time(1, context) + self.cost.start_step_s)
            if budget is not None:
                budget.observe_start(cost)
            total += cost
        self._live[self._starts.going_live(n_live, time_left_s, budget)] = True
        return total

    async def run_beat(self, inp: BeatInput, out: BeatOutput) -> BeatOutput:
        live = np.flatnonzero(inp.live)
        frames = self._frame[live] % self.context_hold if self.context_hold else self._frame[live]
        context = self.context_offset + (float(frames.mean()) if len(live) else 0.0)
        if self.trace is not None:                 # what the backend was handed, at hand-over
            for slot in live:
                for f in range(FRAMES_PER_BEAT):
                    a = inp.audio[slot, f]
                    self.trace.append((inp.beat, int(slot), float(a[0]), float(a[-1])))
        t = self.cost.beat_time(len(live), context)
        if self.cost.jitter_rel:
            t *= max(0.0, 1.0 + self.cost.jitter_rel * self._rng.standard_normal())
        start = self._start_steps(len(live), inp.time_left_s, context)  # by earlier beats' costs
        if self.start_budget is not None:
            self.start_budget.observe_live(len(live), t)
        t += start
        await self.clock.sleep(t)
        for slot in live:
            self._fill(int(slot), inp, out)
        out.compute_s = t
        return out

    def _fill(self, slot: int, inp: BeatInput, out: BeatOutput) -> None:
        for f in range(FRAMES_PER_BEAT):
            frame = int(self._frame[slot])
            audio = inp.audio[slot, f]
            out.pcm[slot, f] = tone(slot, frame)
            out.text[slot, f] = self._text_token(slot, frame)
            queue = self._func_queue[slot]
            out.func[slot, f] = queue.pop(0) if queue and frame >= CALL_AT_FRAME else PAD
            out.user[slot, f] = NO_TOKEN
            if float(np.sqrt(np.mean(audio * audio))) > 0.01:
                out.user[slot, f, 0] = ord("a") + frame % 26
            self._frame[slot] = frame + 1

    def _text_token(self, slot: int, frame: int) -> int:
        if frame % SPEAK_PERIOD >= SPEAK_PERIOD // 2:
            return PAD
        phrase = self.text_codec.encode(f"slot {slot} speaking. ")
        return phrase[frame % len(phrase)]

    def describe(self) -> dict:
        return {"backend": self.name, "max_sessions": self.max_sessions,
                "start_beats_held_back": getattr(self.start_budget, "held_back", 0),
                "starts_refused_no_room": getattr(self.start_budget, "given_up", 0),
                "cost_model": {"profile_bytes_per_session_at_1500": self.cost.session_bytes(1500),
                               "beat_ms_at_max": 1000 * self.cost.beat_time(self.max_sessions,
                                                                            1500)}}
