"""Drives an executor beat by beat the way the clock does, without sockets or a schedule: a
slot book, the executor's own rings, and `beat(audio)`. For tests (the contract test, engine
tests) and device checks (parity, fidelity), so none of them re-implements the clock's order.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from wave_actors.core.contract import BeatOutput, Executor, SessionSpec
from wave_actors.core.frames import BEAT_S
from wave_actors.core.sched.slot_book import BookPlan, SlotBook
from wave_actors.core.sched.snapshots import snapshot_index
from wave_actors.core.sched.start_policy import EagerStarts, StartPolicy


class BeatDriver:
    def __init__(self, executor: Executor, policy: StartPolicy | None = None):
        opts = executor.options
        self.executor = executor
        self.book = SlotBook(executor.max_sessions, executor.start_shape,
                             policy or EagerStarts(), opts.frames_per_session, opts.roll_frames,
                             snapshot_index(executor, executor.start_shape.prefill_chunk))
        self.inp, self.out = executor.alloc_input(), executor.alloc_output()
        self.beats = 0

    def open(self, slot: int, spec: SessionSpec) -> int:
        """Opens a session in the slot (from the next beat); returns its session number."""
        return self.book.open(slot, self.executor.prompt_tokens(spec), spec)

    def close(self, slot: int) -> None:
        self.book.close(slot)

    def force(self, slot: int, ids: list[int]) -> None:
        self.book.force(slot, ids)

    def ready(self, slot: int) -> bool:
        return self.book.ready(slot)

    async def beat(self, audio: np.ndarray | Callable[[BookPlan], np.ndarray] | None = None,
                   time_left_s: float = BEAT_S,
                   on_first: Callable[[BookPlan, BeatOutput], None] | None = None
                   ) -> tuple[BookPlan, BeatOutput]:
        """One beat: plan, pack `audio` ([S, 2, 1280], silence when None; or a function of the
        plan giving it, to feed each session by its own frame index) for the slots in the beat,
        run it on the executor, account for it. The output buffer is reused. An executor that
        finishes frame 0 early is waited for it first, as the clock does, and `on_first` sees
        the outputs then."""
        plan = self.book.plan(time_left_s)
        if callable(audio):
            audio = audio(plan)
        inp = self.inp
        inp.live[:] = False
        inp.live[plan.live] = True
        if audio is None:
            inp.audio[:] = 0.0
        else:
            inp.audio[:] = audio
        inp.beat, inp.time_left_s = self.beats, time_left_s
        self.beats += 1
        self.executor.submit(plan, inp, self.out)
        if self.executor.caps.first_frame:
            await self.executor.wait_first()
            if on_first is not None:
                on_first(plan, self.out)
        await self.executor.wait()
        self.out.compute_s = self.executor.collect(plan, self.out)
        self.book.observe(plan, self.out.compute_s)
        return plan, self.out
