"""The `wpk` executor (issue 18, stage 1): the graph executor's beats, started by a doorbell that a
resident one-program controller answers on the device, with the beat's frames read on the device
straight out of the clients' ring.

A beat, from the clock's call:

  1. `submit` (the clock's thread) writes the beat's descriptor (its rows' slots and the ring
     places of their frames) into pinned memory and rings the mailbox's doorbell with plain
     stores; it makes no CUDA call. The clock's pack named places instead of copying samples
     (`Capabilities.reads_frames`).
  2. On the device the controller sees the doorbell and raises the work word; the beat's prefix,
     queued a beat early on its own stream behind `gate`, runs at once: the descriptor's copy,
     then `gather_frames` (rows read from the ring in mapped host memory, stamps checked).
  3. Meanwhile the worker thread queues what only the plan decides, as the graph executor does:
     the slot resets, the rows' per-row values, then (behind the prefix) the bucket's replay, the
     outputs' copies, `frames_done`, and the next beat's prefix behind its gate.
  4. The controller waits for the frames' counters and publishes the beat done into the mailbox,
     which the loop polls (a load from pinned memory, no CUDA call).

Nothing may load a module or wait for the whole device while the controller is resident (such a
call never returns): captures, the baseline and the executor's close run `_maintenance`: the armed prefix is let
through with no rows, the controller drained, the body run, the controller launched again. The
libraries' kernels are loaded with the context (`CUDA_MODULE_LOADING=EAGER`), and the beat's own
kernels and eager ops run once before the controller first starts. A watchdog rings EXIT when a beat is not done in time or the controller failed; the
executor then serves as the graph executor does (prefix queued at the beat, its events waited
for), with the reason in `describe()["wpk"]`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time

import numpy as np
import torch

from gpu.engine.graph.first_frame import poll_until
from gpu.engine.graph_executor import GraphExecutor
from gpu.wpk import mailbox as M
from gpu.wpk.beat_kernels import Descriptor, frames_done, gate, gather_frames
from gpu.wpk.controller import ControllerFailed, ResidentController
from wave_actors.core.contract import BeatInput, BeatOutput, ExecutorOptions, SessionSpec
from wave_actors.core.frames import FRAMES_PER_BEAT, SAMPLES_IN
from wave_actors.core.registry import REGISTRY
from wave_actors.core.sched.slot_book import BookPlan
from wave_actors.core.timebase import Clock

log = logging.getLogger("wave.wpk_executor")

# A hang, not a slow beat: a beat at full context with start rows takes ~0.2 s; a stuck one
# (a module load behind the resident controller) never ends.
WATCHDOG_S = 2.0
FRAME_TIMEOUT_NS = 1_000_000_000
GATHER_BLOCK = 2048                     # SAMPLES_IN rounded up to a power of two


class WpkExecutor:
    """The graph executor's machinery (its graphs, rings, model runner and beat runner: one
    `GraphExecutor`, composed), with beats started by the doorbell."""
    name = "wpk"
    caps = REGISTRY["wpk"].caps
    resident = False                    # the controller started (not during the graph build)

    def __init__(self, options: ExecutorOptions, capture: bool = True, streams: bool = True,
                 watchdog_s: float = WATCHDOG_S):
        # Every kernel of the libraries loaded when the context is made, not at its first
        # launch: an eager op's first launch behind the resident controller never returns.
        # Read once, at the context's creation: too late if CUDA is up already.
        if not torch.cuda.is_initialized():
            os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
        # Starts prefill here: a snapshot copy is an eager op that would run behind the
        # resident controller, and this executor warms only what its beats launch.
        g = self.graph = GraphExecutor(dataclasses.replace(options, snapshot_mb=0), capture,
                                       streams)
        # what the node and the clock read of an executor, and the machinery the beats share
        self.options, self.device, self.max_sessions = g.options, g.device, g.max_sessions
        self.text_codec, self.user_codec, self.start_shape = \
            g.text_codec, g.user_codec, g.start_shape
        self.snapshot_space, self.start_row_s, self.beat_at_context_s = \
            g.snapshot_space, g.start_row_s, g.beat_at_context_s
        self.runner, self.graphs, self.rings, self.beats = g.runner, g.graphs, g.rings, g.beats
        self.module_loading = os.environ.get("CUDA_MODULE_LOADING", "LAZY")
        dev, rows = self.device, self.max_sessions
        self._desc_h = torch.zeros(Descriptor.words(rows), dtype=torch.int64, pin_memory=True)
        self._desc_d = torch.zeros_like(self._desc_h, device=dev)
        self.descriptor = Descriptor(self._desc_h.numpy(), rows)
        self._torn_d = torch.zeros(rows + 1, FRAMES_PER_BEAT, dtype=torch.int32, device=dev)
        self._torn_h = torch.zeros(rows + 1, FRAMES_PER_BEAT, dtype=torch.int32, pin_memory=True)
        self._work = torch.zeros(1, dtype=torch.int32, device=dev)
        self._args = torch.zeros(1, dtype=torch.int32, device=dev)
        self._frame_ctr = torch.zeros(2, dtype=torch.int32, device=dev)
        self._stop_h = torch.full((1,), M.STOP, dtype=torch.int32, pin_memory=True)
        self._ctl_stream = torch.cuda.Stream()
        self._prefix_stream = torch.cuda.Stream()
        self._side = torch.cuda.Stream()
        self._prefix_done = torch.cuda.Event()
        self._replayed = torch.cuda.Event()
        self._no_ring = [torch.zeros(1, dtype=torch.int64, device=dev),
                         torch.zeros(1, dtype=torch.int64, device=dev),
                         torch.zeros(SAMPLES_IN, dtype=torch.float32, device=dev)]
        self._no_rows = torch.zeros(1, dtype=torch.int64, device=dev)   # a descriptor of none
        self._ring_src = None           # the FrameRing the prefix reads, once registered
        self._ring_args = self._no_ring
        self._ring_registered: list[int] = []
        self._armed = 0                 # the run the queued prefix waits for (0: none queued)
        self._ring = None               # the beat in flight's ring (None: waited on events)
        self._frames = None             # the beat in flight's FramesToRead (read on the device)
        self.failed: str | None = None
        self.fallback_beats = 0
        self.doorbell_beats = 0
        self.box = M.Mailbox("cuda")
        self.controller = ResidentController(self._launch_controller, self.box, watchdog_s,
                                             on_fail=self._fail_over)
        self._warm()
        self.controller.start()
        self.resident = True
        self._arm()

    @classmethod
    def build(cls, options: ExecutorOptions, clock: Clock | None = None) -> "WpkExecutor":
        return cls(options)

    @property
    def model(self):
        return self.runner.model

    @property
    def state(self):
        return self.runner.state

    @property
    def on_launched(self):
        return self.beats.on_launched

    @on_launched.setter
    def on_launched(self, fn) -> None:
        self.beats.on_launched = fn

    def prompt_tokens(self, spec: SessionSpec) -> list[int]:
        return self.graph.prompt_tokens(spec)

    memory_ceiling = staticmethod(GraphExecutor.memory_ceiling)

    def reset(self) -> None:
        self.graph.reset()

    # -- the resident controller ------------------------------------------------------------
    def _launch_controller(self, first_seq: int, runs: int) -> None:
        with torch.cuda.stream(self._ctl_stream):
            M.controller[(1,)](self.box.block, self._work, self._args, self._frame_ctr, 1,
                               first_seq, runs, FRAME_TIMEOUT_NS, IS_INTERP=False, num_warps=1)

    def _warm(self) -> None:
        """Every kernel and eager op a beat launches, once, before anything is resident: a
        module first loaded while the controller runs would never return."""
        ctr = torch.zeros(2, dtype=torch.int32, device=self.device)
        with torch.no_grad():
            gate[(1,)](self._work, 0, IS_INTERP=False, num_warps=1)
            frames_done[(1,)](ctr, IS_INTERP=False, num_warps=1)
            self._gather()
            ctr[:1].copy_(self._stop_h, non_blocking=True)
            t = self.graphs.trash
            idx = torch.tensor([t], device=self.device)
            self.state.reset(idx)
            self.model.warm(self.state, idx)
            if self.options.context_offset:
                self.graph.prefill_context([t])
            self.model.roll(self.state, t, 1, self.options.roll_frames)
            self.state.reset(idx)
            self.model.warm(self.state, idx)
        torch.cuda.synchronize()

    def _gather(self, desc: torch.Tensor | None = None) -> None:
        number, generation, pcm = self._ring_args
        gather_frames[(self.max_sessions, FRAMES_PER_BEAT)](
            self._desc_d if desc is None else desc, number, generation, pcm, self.graphs.d_audio,
            self._torn_d,
            MAX_ROWS=self.max_sessions, SAMPLES=SAMPLES_IN, BLOCK=GATHER_BLOCK,
            IS_INTERP=False, num_warps=4)

    def _arm(self, gated: bool = True) -> None:
        """The next beat's prefix on its stream, after the last replay read the audio rows:
        behind `gate` for the next run, or (after a fail-over) at once."""
        with torch.cuda.stream(self._prefix_stream):
            self._prefix_stream.wait_event(self._replayed)
            if gated:
                self._armed = self.controller.runs + 1
                gate[(1,)](self._work, self._armed, IS_INTERP=False, num_warps=1)
            self._desc_d.copy_(self._desc_h, non_blocking=True)
            self._gather()
            self._prefix_done.record()

    def _let_through(self) -> None:
        """The queued prefix released with no rows, and its run completed, so the controller
        can be drained (nothing of the stream waits on it afterwards)."""
        if not self._armed or self.failed:
            self._armed = 0
            return
        self.descriptor.clear()
        with torch.cuda.stream(self._prefix_stream):
            frames_done[(1,)](self._frame_ctr, IS_INTERP=False, num_warps=1)
        ring = self._ring_beat(-1, 0)
        if ring is not None:        # done, or the controller ended (given up meanwhile)
            self.box._wait(lambda: self.box.beat_done(ring) or self.box.state != M.RUNNING,
                           WATCHDOG_S, f"the armed prefix let through (ring {ring.seq})")

    def _ring_beat(self, beat: int, live: int) -> M.Ring | None:
        """Rings the armed prefix's run; None when the watchdog gave the controller up (then
        the armed prefix runs anyway: its gate is open)."""
        try:
            return self.controller.beat(beat, live)
        except ControllerFailed:
            return None
        finally:
            self._armed = 0

    @contextlib.contextmanager
    def _maintenance(self):
        """Nothing resident while the body runs (captures, eager model runs, registration,
        page-locking). Called between beats."""
        if not self.resident or self.failed:
            yield
            return
        self._let_through()
        if self.failed:
            yield
            return
        pause = self.controller.paused()
        try:
            pause.__enter__()
        except ControllerFailed:            # given up since: nothing resident to drain
            yield
            return
        try:
            yield
            torch.cuda.synchronize()
        finally:
            pause.__exit__(None, None, None)
        self._arm()

    def _fail_over(self, why: str) -> None:
        """The watchdog's call (its thread): every gate opened with one copy on a side stream
        (the controller may be gone without raising the work word); beats go on as graph
        beats."""
        self.failed = why
        log.error("wpk: the resident controller is given up, serving as the graph executor "
                  "does: %s", why)
        with torch.cuda.stream(self._side):
            self._work.copy_(self._stop_h, non_blocking=True)

    # -- maintenance the graph executor does between beats ---------------------------------------
    def prepare(self, sessions: int, optional: bool = False) -> bool:
        with self._maintenance():
            return self.graph.prepare(sessions, optional)

    def baseline(self, context: int) -> dict:
        with self._maintenance():
            return self.graph.baseline(context)

    def alloc_input(self) -> BeatInput:
        with self._maintenance():           # page-locking may wait for the device
            return self.graph.alloc_input()

    def alloc_output(self, into: BeatOutput | None = None) -> BeatOutput:
        with self._maintenance():
            return self.graph.alloc_output(into)

    def _register_ring(self, ring) -> None:
        """The clients' ring registered and mapped for the device (its three arrays lie in one
        segment, each on pages of its own)."""
        lo = min(a.ctypes.data for a in (ring.number, ring.generation, ring.pcm))
        hi = max(a.ctypes.data + a.nbytes for a in (ring.number, ring.generation, ring.pcm))
        if lo not in self._ring_registered:
            err = int(torch.cuda.cudart().cudaHostRegister(lo, hi - lo, 3))   # portable|mapped
            if err:
                raise RuntimeError(f"cudaHostRegister of the ring of frames failed "
                                   f"(cudaError {err})")
            self._ring_registered.append(lo)
        self._ring_src = ring
        self._ring_args = [torch.from_numpy(ring.number), torch.from_numpy(ring.generation),
                           torch.from_numpy(ring.pcm)]
        # Launched once now (no rows), while nothing is resident: should these pointers pick
        # another specialisation of the kernel, its module loads here, not behind the doorbell.
        self._gather(self._no_rows)

    # -- the beat --------------------------------------------------------------------------------
    def submit(self, plan: BookPlan, inp: BeatInput, out: BeatOutput) -> None:
        t0 = time.perf_counter()
        self.graph.first.expect(plan, out)
        frames = self._frames = inp.frames
        self._ring = None
        if self._armed and not self.failed and (frames is None or frames.ring is self._ring_src):
            self.descriptor.write(np.asarray(plan.live, np.int64), frames)
            self._ring = self._ring_beat(inp.beat, len(plan.live))
        self.beats.submit(self._launch, plan, inp, out, t0)

    async def wait_first(self) -> None:
        await self.graph.wait_first()

    async def wait(self) -> None:
        await self.beats.wait(self.device_done)

    def _launch(self, plan: BookPlan, inp: BeatInput, out: BeatOutput) -> bool:
        """Worker thread: what only the plan decides, behind the prefix (see the module's
        docstring). A beat the doorbell could not start (the ring of frames not registered
        yet, or the controller given up) starts its prefix here."""
        t0 = time.perf_counter()
        frames = inp.frames
        if self._ring is None:
            if not self.failed and frames is not None and frames.ring is not self._ring_src:
                with self._maintenance():
                    self._register_ring(frames.ring)
            self.descriptor.write(np.asarray(plan.live, np.int64), frames)
            if not self.failed:
                self._ring = self._ring_beat(inp.beat, len(plan.live))
            if self._ring is None:
                self._arm(gated=False)
        if self._ring is not None:
            self.doorbell_beats += 1
        else:
            self.fallback_beats += 1
        self.beats.start.record()
        with torch.no_grad():
            self.runner.reset(plan)
            if plan.live or plan.rows:
                self._enqueue(plan, inp, out)
            if plan.started and self.options.context_offset:
                self.graph.prefill_context(plan.started)
            frames_done[(1,)](self._frame_ctr, IS_INTERP=False, num_warps=1)
        self.beats.done.record()
        with torch.no_grad():
            self.runner.roll(plan)
            self.runner.clean(plan)
        if not self.failed:
            self._arm()
        return self.beats.launched(t0)

    def _enqueue(self, plan: BookPlan, inp: BeatInput, out: BeatOutput) -> None:
        """As the graph executor's, but the audio rows come from the prefix (read from the ring)
        unless the clock packed them (no ring: copied as the graph executor copies them)."""
        hi = max(plan.live, default=-1) + 1
        g = self.graphs.rows_in(plan)
        torch.cuda.current_stream().wait_event(self._prefix_done)
        if hi and inp.frames is None:
            self.graphs.d_audio[:hi].copy_(self.rings.tensor(inp.audio)[:hi], non_blocking=True)
        self.graphs.replay(g)
        self._replayed.record()
        if hi:
            self.rings.outputs_from(self.graphs.d_out, out, hi)
        if hi and inp.frames is not None:
            self._torn_h[:hi].copy_(self._torn_d[:hi], non_blocking=True)

    async def device_done(self, t0: float, fastest: float | None) -> None:
        """As the graph executor's, but the beat's end is read from the mailbox (a load from
        pinned memory) while the controller serves; from its event after a fail-over."""
        ring = self._ring
        if ring is not None and not self.failed:
            await poll_until(lambda: self.box.beat_done(ring) or bool(self.failed), t0, fastest)
            if self.box.beat_done(ring):
                return
        await self.graph.device_done(t0, fastest)      # failed over (before or meanwhile)

    def collect(self, plan: BookPlan, out: BeatOutput) -> float:
        """The beat's outputs are in `out` already; frames the device found written again are
        recorded for the clock to count (`FramesToRead.torn`)."""
        done = self.beats.collect()
        frames, self._frames = self._frames, None
        if frames is not None and plan.live:
            slots = np.asarray(plan.live, np.int64)
            r, f = np.nonzero(self._torn_h.numpy()[slots])
            if len(r):
                frames.torn.append((slots[r], f))
        return done

    def describe(self) -> dict:
        return self.graph.describe() | {"wpk": {
            "controller": "failed over to graph beats" if self.failed else "resident",
            "module_loading": self.module_loading,
            "failed": self.failed, "doorbell_beats": self.doorbell_beats,
            "fallback_beats": self.fallback_beats, "frames_read_on_device": self._ring_src
            is not None, "heartbeat": self.box.heartbeat(), "state": self.box.state}}

    def close(self) -> None:
        if self.beats.inflight is not None:
            self.beats.inflight[0].result()
        if not self.failed:
            self._let_through()
            self.controller.stop()
        self.beats.close()
        torch.cuda.synchronize()
        for ptr in self._ring_registered:
            torch.cuda.cudart().cudaHostUnregister(ptr)
        self._ring_registered.clear()
        self.graph.close()
