"""The `cpu` executor: the reference VoiceChat model on the CPU (tiny config by default).

`submit` hands the book's plan to one worker thread and returns; the worker runs the plan (slot
resets, the live rows' two frames batched, context rolls, then the start rows) and writes the
outputs into `BeatOutput`. The event loop stays free while it computes.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from gpu.engine.model_runner import (ModelRunner, check_host_memory, load_model, model_config,
                                     text_codecs)
from gpu.model.config import Profile
from wave_actors.core.contract import (BeatInput, BeatOutput, ExecutorOptions, SessionSpec,
                                       need_slots)
from wave_actors.core.registry import REGISTRY
from wave_actors.core.sched.slot_book import BookPlan
from wave_actors.core.sched.start_shape import StartShape
from wave_actors.core.timebase import Clock

THREADS = 1                 # torch intra-op threads: tiny ops lose more to threading than they gain
# Start rows on the CPU: every starting session in every beat, 64 prompt positions a row; the
# prompt may be long (the CPU has host memory to spare).
CPU_SHAPE = dict(prefill_chunk=64, start_rows=1 << 30, max_prompt=2048)
SNAPSHOT_BYTES = 64e6       # prompt snapshots kept in host memory (the tiny model's are ~MB)


class CpuExecutor:
    name = "cpu"
    caps = REGISTRY["cpu"].caps
    on_launched = None

    def __init__(self, options: ExecutorOptions):
        self.options = options
        self.max_sessions = need_slots(options, self.name)
        self.text_codec, self.user_codec = text_codecs(options)
        cfg, char_table = model_config(options, self.text_codec)
        self.profile = Profile.named(options.profile)
        self.start_shape = StartShape(warmup_positions=cfg.talker.n_warmup, **CPU_SHAPE)
        torch.set_num_threads(THREADS)
        check_host_memory(cfg, self.profile, options, self.start_shape.max_prompt)
        model = load_model(cfg, self.profile, options, "cpu", char_table)
        self.runner = ModelRunner(model, options, self.start_shape, options.max_sessions,
                                  SNAPSHOT_BYTES if options.snapshot_mb < 0
                                  else options.snapshot_mb * 1e6)
        self.snapshot_space = self.runner.snapshots.space
        self.beat_cpu_s: deque[float] = deque(maxlen=1024)   # worker CPU time of recent beats
        self._worker = ThreadPoolExecutor(1, "wave-cpu", initializer=torch.set_num_threads,
                                          initargs=(THREADS,))
        self._inflight: Future | None = None
        self._first: asyncio.Event | None = None    # frame 0 of the beat in flight is out

    @classmethod
    def build(cls, options: ExecutorOptions, clock: Clock | None = None) -> "CpuExecutor":
        return cls(options)

    @property
    def model(self):
        return self.runner.model

    @property
    def cfg(self):
        return self.runner.model.cfg

    def alloc_input(self) -> BeatInput:
        return BeatInput.alloc(self.max_sessions)

    def alloc_output(self, into: BeatOutput | None = None) -> BeatOutput:
        return into if into is not None else BeatOutput.alloc(self.max_sessions)

    def prompt_tokens(self, spec: SessionSpec) -> list[int]:
        return self.runner.prompt_tokens(self.text_codec, spec)

    def reset(self) -> None:
        """Slot state is reset per slot after a session closes or when one opens (`plan.cleans`,
        `plan.resets`): nothing to do."""

    # -- the beat --------------------------------------------------------------------------------
    def submit(self, plan: BookPlan, inp: BeatInput, out: BeatOutput) -> None:
        loop, first = asyncio.get_running_loop(), asyncio.Event()
        self._first = first
        self._inflight = self._worker.submit(self._run, plan, inp, out,
                                             lambda: loop.call_soon_threadsafe(first.set))

    async def wait(self) -> None:
        if self._inflight is not None:
            await asyncio.wrap_future(self._inflight)

    async def wait_first(self) -> None:
        if self._inflight is not None:
            await self._first.wait()

    def collect(self, plan: BookPlan, out: BeatOutput) -> float:
        done, self._inflight = self._inflight, None
        return done.result()

    def _run(self, plan: BookPlan, inp: BeatInput, out: BeatOutput, first) -> float:
        """Worker thread: the plan, in order; returns its wall time. `first()` is called when
        frame 0's outputs are in `out` (or the beat ended without them)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        runner = self.runner
        try:
            with torch.no_grad():
                runner.reset(plan)
                if plan.live:
                    runner.frames(plan, inp.audio, out, lambda f: f == 0 and first())
                runner.roll(plan)
                runner.start_rows(plan)
                runner.save(plan)
                runner.clean(plan)
        finally:
            first()
        self.beat_cpu_s.append(time.thread_time() - c0)
        return time.perf_counter() - t0

    # -- facts -------------------------------------------------------------------------------------
    def describe(self) -> dict:
        return self.runner.facts(self.name, self.text_codec, self.profile)

    def close(self) -> None:
        self._worker.shutdown(wait=True)
