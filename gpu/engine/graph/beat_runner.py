"""A GPU executor's beat on the host: a worker thread enqueues it, the loop waits for its end,
and each beat leaves what the next ones learn from.

How a beat is waited for (`ExecutorOptions.beat_wait`): the worker enqueues the beat (the
copies, the replay) and returns while the GPU works; the event loop then sleeps until just
before the fastest recent beat of its graph could end and asks whether it is done once per
loop iteration ("poll"). The times it learns from are the device's own (CUDA events at the
beat's first and last work), not the loop's: a wall time includes the sleep, so one slow beat
would make every later beat of its graph sleep as long and learn the same time again.
"thread": the worker waits on the device itself.

The executor supplies the launch (what it enqueues, between `start` and `done`) and how its
end is seen (`device_done`); the graph and wpk executors share everything else.
"""
from __future__ import annotations

import asyncio
import collections
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Awaitable, Callable

import torch

from wave_actors.core.contract import BeatInput, BeatOutput
from wave_actors.core.frames import BEAT_S
from wave_actors.core.sched.slot_book import BookPlan
from wave_actors.core.sched.spread import spread_ms

ALLOCATOR_COUNTS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")

Launch = Callable[[BookPlan, BeatInput, BeatOutput], bool]
DeviceDone = Callable[[float, "float | None"], Awaitable[None]]


class BeatRunner:
    def __init__(self, poll: bool, graph_of: Callable[[BookPlan], tuple[int, int]]):
        """`poll`: the loop polls the beat's end (else the worker waits for it); `graph_of`:
        the graph a plan replays (beats are timed per graph)."""
        self.poll, self._graph_of = poll, graph_of
        self.start = torch.cuda.Event(enable_timing=True)     # the beat's first work
        self.done = torch.cuda.Event(enable_timing=True)      # and its last
        self._recent: dict[tuple[int, int], collections.deque] = {}   # device times by graph
        self.polled_beats = 0
        self.beats_run = 0
        # the worker's time to enqueue each beat (resets, replay, copies, rolls): a beat whose
        # launch blocks (a synchronising copy, the allocator short of memory) shows here first
        self.launch_s: collections.deque[float] = collections.deque(maxlen=4096)
        # beats that took longer than a beat, with what they carried and where the time went
        # (enqueue on the worker vs. the device) and the allocator's counters at that point
        self.slow_beats: collections.deque[dict] = collections.deque(maxlen=32)
        # device time of the beats' slot resets and snapshot copies, and of the rolls and
        # cleans queued behind a beat (which the next beat's work waits for): (ms, how many)
        self.start_ms = {k: collections.deque(maxlen=4096)
                         for k in ("reset", "copy", "roll", "clean")}
        self._timing: list[tuple] = []
        self._behind: list[tuple] = []          # the last beat's work behind its end
        self._behind_next: list[tuple] = []     # this beat's
        self.on_launched: Callable[[], None] | None = None
        self._worker = ThreadPoolExecutor(1, "wave-graph")
        self.inflight: tuple[Future, float, BookPlan] | None = None
        self._done_s: float | None = None

    def submit(self, launch: Launch, plan: BookPlan, inp: BeatInput, out: BeatOutput,
               t0: float) -> None:
        """`launch(plan, inp, out)` on the worker; `t0`: when the clock asked for the beat."""
        self._done_s = None
        self.inflight = (self._worker.submit(launch, plan, inp, out), t0, plan)

    def launched(self, t0: float) -> bool:
        """On the worker, at the end of a launch begun at t0: with beat_wait "thread", the wait
        for the device. Returns whether it waited."""
        self.launch_s.append(time.perf_counter() - t0)
        if not self.poll:
            self.done.synchronize()
        return not self.poll

    def ended(self) -> bool:
        """The beat in flight ended (failed, or its device work is done)."""
        job = self.inflight[0]
        return job.done() and (job.exception() is not None or self.done.query())

    async def wait(self, device_done: DeviceDone) -> None:
        if self.inflight is None or self._done_s is not None:
            return
        job, t0, plan = self.inflight
        synced = await asyncio.wrap_future(job)             # the beat's work is queued
        launched = time.perf_counter() - t0
        if self.on_launched is not None:
            self.on_launched()
        if not synced:
            recent = self._recent.setdefault(self._graph_of(plan), collections.deque(maxlen=8))
            await device_done(t0, min(recent, default=None))
            recent.append(1e-3 * self.start.elapsed_time(self.done))
            self.polled_beats += 1
        self._done_s = time.perf_counter() - t0
        self.beats_run += 1
        # the work behind the last beat ran before this beat's: its events have passed
        for name, a, b, n in self._timing + self._behind:
            self.start_ms[name].append((a.elapsed_time(b), n))
        self._timing.clear()
        self._behind, self._behind_next = self._behind_next, []
        if self._done_s > BEAT_S:
            self.slow_beats.append(self._slow_beat(plan, launched, self._done_s))

    def _slow_beat(self, plan: BookPlan, launched: float, done: float) -> dict:
        stats = torch.cuda.memory_stats()
        return {"beat": self.beats_run, "live": len(plan.live), "rows": len(plan.rows),
                "resets": len(plan.resets), "rolls": len(plan.roll),
                "launch_ms": round(1e3 * launched, 1), "done_ms": round(1e3 * done, 1),
                "allocator": {k: stats.get(k) for k in ALLOCATOR_COUNTS}}

    def collect(self) -> float:
        job, _t0, _plan = self.inflight
        self.inflight = None
        job.result()
        return self._done_s

    def timed(self, name: str, n: int, fn, arg, behind: bool = False) -> None:
        """fn(arg) between two device events when it has n > 0 things to do (read at the
        beat's end: no wait here; `behind` the beat's end event: at the next beat's)."""
        if not n:
            return
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(arg)
        b.record()
        (self._behind_next if behind else self._timing).append((name, a, b, n))

    def facts(self) -> dict:
        return {"beat_wait": "poll" if self.poll else "thread",
                "beats_polled": self.polled_beats, "launch_ms": spread_ms(self.launch_s),
                "allocator": {k: torch.cuda.memory_stats().get(k) for k in ALLOCATOR_COUNTS},
                "beats_run": self.beats_run, "slow_beats": list(self.slow_beats)}

    def close(self) -> None:
        """After the beat in flight, if any: no more launches."""
        self._worker.shutdown(wait=True)
