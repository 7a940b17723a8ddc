"""The `graph` executor: the full model on one GPU, every live session advanced together, two
frames per beat as one CUDA-graph replay.

  - weights drawn on the device (or loaded), state preallocated for `max_sessions` + 1 slots at
    start; the extra slot is a trash row that padded batch entries read from and write into;
  - the model's decode hooks routed to the Triton kernels (`decode_ops`), so per-session state is
    updated in place and attention reads only the context in use;
  - one graph per batch-size bucket, and two more per bucket that also carry start rows:
    `small_rows` or `start_rows` starting sessions' next prompt chunks (padded rows go to the
    trash slot), beside the live rows, so a session's start is part of a captured beat and no
    eager start work runs while serving; a beat replays the smallest capture that holds its
    rows. The largest bucket's graphs are captured when the executor is built, and what the
    rows add to its beat is measured then (`describe()["start_rows"]`); the others are
    captured by `prepare` between beats. The talker's warm-up is copied in with the
    slot's reset;
  - one copy each way per beat: the clock packs frames straight into this executor's pinned
    input ring, which goes to the device as it is (the rows up to the highest live slot); the
    replay gathers its rows by slot on the device and scatters its outputs back by slot, and the
    output rows come back into the pinned output ring. No host gather, no host scatter;
  - a configuration that does not fit in device memory is refused at start, saying why.

How a beat is waited for (`ExecutorOptions.beat_wait`): a worker thread enqueues the beat (the
copies, the replay) and returns while the GPU works; the event loop then sleeps until just
before the fastest recent beat of this bucket could end and asks the beat's CUDA event whether
it is done once per loop iteration ("poll"). The times it learns from are the device's own
(CUDA events at the beat's first and last work), not the loop's: a wall time includes the
sleep, so one slow beat would make every later beat of its bucket sleep as long and learn the
same time again. "thread": the worker waits on the device itself.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from gpu.engine.baseline import measure_baseline
from gpu.engine.beat_streams import StreamedBeat
from gpu.engine.decode_ops import TritonDecodeOps, install
from gpu.engine.memory_plan import (GRAPH_FIXED_BYTES, LADDER_BYTES, LADDER_KEEP_FREE,
                                    SNAPSHOT_BYTES, MemoryPlan, memory_ceiling)
from gpu.engine.model_runner import ModelRunner, model_config, text_codecs
from gpu.model.checkpoint import load_checkpoint
from gpu.model.config import Profile
from gpu.model.voicechat import VoiceChat
from gpu.model.voicechat_weights import load_dtype, random_weights_on
from wave_actors.core.sched.buckets import BUCKETS, bucket_for
from wave_actors.core.contract import (MAX_USER_TOKENS, NO_TOKEN, BeatInput, BeatOutput,
                                       ExecutorOptions, SessionSpec)
from wave_actors.core.frames import BEAT_S, FRAMES_PER_BEAT, SAMPLES_IN, SAMPLES_OUT
from wave_actors.core.registry import REGISTRY
from wave_actors.core.sched.slot_book import BookPlan
from wave_actors.core.sched.start_shape import StartShape
from wave_actors.core.sched.spread import spread_ms
from wave_actors.core.timebase import Clock

log = logging.getLogger("wave.graph_executor")

SMALL_FIRST = 16              # buckets up to this many rows are captured right after the top
# A node sized by the executor (max_sessions 0) takes the most sessions whose beat, every cache
# at its full context, the device runs in this share of a beat: the rest is the host's (packing,
# routing: p99 under 3 ms at dense 300), the rolls', and what the start policy lets start rows
# and snapshot copies take where a beat has room.
ON_TIME_SHARE = 0.88
POLL_LEAD_S = 1.5e-3         # poll the beat's event from this long before the fastest recent beat
POLL_UNKNOWN_S = 5e-4        # a bucket's first beats (no time known): poll at this interval
OUTPUTS = ("pcm", "text", "func", "user")


ALLOCATOR_COUNTS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")


class _Captured:
    """One bucket's graph with its static device inputs (the rows' slots and per-row values;
    the audio rows are gathered by slot inside the graph; with start rows, their slots, prompt
    chunks and valid counts) and their pinned host twins."""

    def __init__(self, bucket: int, device: torch.device, start_rows: int = 0, chunk: int = 0):
        z = lambda *shape, dtype=torch.long: torch.zeros(*shape, dtype=dtype, device=device)  # noqa: E731
        self.bucket, self.start_rows = bucket, start_rows
        self.d_in = {"slots": z(bucket), "forced": z(bucket, 2), "session": z(bucket),
                     "frame0": z(bucket)}
        if start_rows:
            self.d_in |= {"row_slots": z(start_rows), "row_tokens": z(start_rows, chunk),
                          "row_valid": z(start_rows)}
        self.audio = z(bucket, FRAMES_PER_BEAT, SAMPLES_IN, dtype=torch.float32)
        self.h_in = {k: torch.zeros(v.shape, dtype=v.dtype, pin_memory=True)
                     for k, v in self.d_in.items()}
        self.graph: torch.cuda.CUDAGraph | None = None


class GraphExecutor:
    name = "graph"
    caps = REGISTRY["graph"].caps

    def __init__(self, options: ExecutorOptions, capture: bool = True, streams: bool = True):
        """capture=False runs the same beat body eagerly instead of replaying its graph, and
        streams=False runs a beat's stages in order on one stream: the same kernels on the same
        batch either way, so the outputs must equal the default's bit for bit (the same-precision
        parity checks of bench/graph_check.py)."""
        if not torch.cuda.is_available():
            raise RuntimeError("the graph executor needs a CUDA device; use --backend cpu or sim")
        if options.beat_wait not in ("poll", "thread"):
            raise ValueError(f"beat_wait {options.beat_wait!r}: choose poll or thread")
        self.device = torch.device("cuda")
        self.text_codec, self.user_codec = text_codecs(options)
        self.cfg, char_table = model_config(options, self.text_codec)
        self.profile = Profile.named(options.profile)
        self.start_shape = StartShape(warmup_positions=self.cfg.talker.n_warmup,
                                      **({"start_rows": options.start_rows}
                                         if options.start_rows else {}))
        sizing = options.max_sessions == 0
        snapshot_bytes = (SNAPSHOT_BYTES if options.snapshot_mb < 0
                          else options.snapshot_mb * 1e6)
        ceiling = MemoryPlan(self.cfg, self.profile, 1, options.max_context,
                             self.start_shape.max_prompt, snapshot_bytes
                             ).ceiling(torch.cuda.mem_get_info()[0]
                                       - (LADDER_BYTES if sizing else 0))
        if sizing:      # state for every slot memory holds; the measured beat picks how many serve
            if ceiling < 1:
                raise MemoryError(f"not one session at {options.max_context} frames of context "
                                  "fits in the device's free memory")
            # past the largest bucket the host, not the device, is what runs out
            options = dataclasses.replace(options, max_sessions=min(ceiling, BUCKETS[-1]))
        self.options, self.capture = options, capture
        self.max_sessions = options.max_sessions
        self.plan_memory = MemoryPlan(self.cfg, self.profile, options.max_sessions,
                                      options.max_context, self.start_shape.max_prompt,
                                      snapshot_bytes)
        self.plan_memory.check(torch.cuda.mem_get_info()[0])
        torch.backends.cuda.matmul.allow_tf32 = self.profile.tf32
        torch.backends.cudnn.allow_tf32 = self.profile.tf32
        self.runner = ModelRunner(self._build_model(char_table), options, self.start_shape,
                                  options.max_sessions + 1, snapshot_bytes)
        self.snapshot_space = self.runner.snapshots.space
        # device time of the beats' slot resets and snapshot copies: (ms, how many)
        self.start_ms = {k: collections.deque(maxlen=4096) for k in ("reset", "copy")}
        self._timing: list[tuple] = []
        self.trash = options.max_sessions
        s, dev = options.max_sessions + 1, self.device
        self.d_audio = torch.zeros(s, FRAMES_PER_BEAT, SAMPLES_IN, device=dev)   # row S: zeros
        self.d_out = {"pcm": torch.zeros(s, FRAMES_PER_BEAT, SAMPLES_OUT, device=dev),
                      "text": torch.zeros(s, FRAMES_PER_BEAT, dtype=torch.int32, device=dev),
                      "func": torch.zeros(s, FRAMES_PER_BEAT, dtype=torch.int32, device=dev),
                      "user": torch.full((s, FRAMES_PER_BEAT, MAX_USER_TOKENS), NO_TOKEN,
                                         dtype=torch.int32, device=dev)}
        # Frame 0's rows of every slot, copied to pinned memory inside the beat on a side
        # stream, then the count of beats that got that far (`_first_out`): the host polls the
        # count and routes frame 0 while frame 1 computes.
        self._first_dev = {k: torch.empty(v[:, 0].shape, dtype=v.dtype, device=dev)
                           for k, v in self.d_out.items()}
        self._first_host = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
                            for k, v in self._first_dev.items()}
        self._first_count = torch.zeros(1, dtype=torch.int64, device=dev)
        self._first_seen = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        self._first_seen_np = self._first_seen.numpy()
        self._first_stream = torch.cuda.Stream()
        self._first_pending: tuple | None = None          # (out, rows, count before the beat)
        self._recent_first: dict[tuple[int, int], collections.deque] = {}
        self._pinned: dict[int, torch.Tensor] = {}        # a ring array's address → its tensor
        self._registered: list[int] = []                  # host memory we page-locked
        self._graphs: dict[tuple[int, int], _Captured] = {}   # (bucket, start rows it holds)
        # One memory pool for every beat graph and the eager warm-up before each capture: the
        # warm-up's blocks are the ones its capture then takes, and a smaller bucket's capture
        # reuses what a larger one freed (outside the pool, a warm-up needs memory of its own,
        # which a node filled to its memory ceiling does not have).
        self._mempool = torch.cuda.MemPool()
        self._pool = self._mempool.id
        self.streamed = StreamedBeat(self.model, self.device) if streams else None
        self.poll = options.beat_wait == "poll"
        self.first_poll_s = options.first_poll_ms / 1e3
        self._beat_start = torch.cuda.Event(enable_timing=True)
        self._beat_done = torch.cuda.Event(enable_timing=True)
        # graph → its recent beats' device times (start event to done event)
        self._recent: dict[tuple[int, int], collections.deque] = {}
        self.polled_beats = 0
        # the worker's time to enqueue each beat (resets, replay, copies, rolls): a beat whose
        # launch blocks (a synchronising copy, the allocator short of memory) shows here first
        self.launch_s: collections.deque[float] = collections.deque(maxlen=4096)
        # beats that took longer than a beat, with what they carried and where the time went
        # (enqueue on the worker vs. the device) and the allocator's counters at that point
        self.slow_beats: collections.deque[dict] = collections.deque(maxlen=32)
        self.beats_run = 0
        self.on_launched = None
        self._worker = ThreadPoolExecutor(1, "wave-graph")
        self._inflight: tuple[Future, float, BookPlan] | None = None
        self._done_s: float | None = None
        # The thinker positions a start row may reach (a prompt chunk past the prompt's last
        # position), rounded up: the start rows' attention runs on this window of the caches.
        chunk = self.start_shape.prefill_chunk
        self._prompt_window = min(-(-(self.start_shape.max_prompt + chunk) // 64) * 64,
                                  self.state.thinker.max_positions)
        # The largest bucket is captured now, with and without start rows, so no beat ever
        # waits for a capture; smaller ones (less padding) are captured between beats by
        # `prepare`.
        with torch.no_grad():       # the warm-up rows every reset copies: run once, now
            self.model.warm_template(self.state.talker)
        self.slots = self._size_slots(self.max_sessions, ceiling) if sizing else {
            "sessions": self.max_sessions, "decided_by": "max_sessions (set by the caller)",
            "memory_ceiling": ceiling, "budget_ms": round(1e3 * ON_TIME_SHARE * BEAT_S, 1),
            "beat_ms_at_context": {}}
        self.max_sessions = self.slots["sessions"]
        top = bucket_for(self.max_sessions, self.max_sessions)
        self._warm_eager()
        t0 = time.perf_counter()
        # Every bucket up to the top, so a beat replays the smallest that holds its rows (a lone
        # caller's beat is a one-row beat). The top first: the graphs share one memory pool, and
        # a smaller capture fits in the blocks a larger one freed. Then the small buckets, which
        # take little beyond their graphs' fixed part and save the most (a beat of a few calls,
        # the first beats of a fill), then the rest largest first, while memory lasts.
        wanted = [top] + [b for b in BUCKETS if b <= SMALL_FIRST and b < top] + [
            b for b in reversed(BUCKETS) if SMALL_FIRST < b < top]
        for key in [k for k in self._graphs if k[0] not in wanted]:
            del self._graphs[key]                                 # the sizing's probes
        self.prepare(top)
        took, last = 0.0, top      # device memory the last bucket captured took, its size
        skipped = []
        for b in wanted[1:]:
            # a bucket's graphs take their fixed part and about its rows' share of what the
            # last one took beyond that; where that would leave too little free, the bucket is
            # skipped (its beats pad to the next one up) and a smaller one may still fit
            free = torch.cuda.mem_get_info()[0]
            if b > SMALL_FIRST >= last:
                took, last = 0.0, top   # past the small ones: priced from the larger ones only
            need = max(0.0, took - GRAPH_FIXED_BYTES) * b / last + GRAPH_FIXED_BYTES
            if free - need < LADDER_KEEP_FREE \
                    or not self.prepare(b, optional=True):
                skipped.append(b)
                continue
            took, last = max(0, free - torch.cuda.mem_get_info()[0]), b
        if skipped:
            log.warning("device memory for beat graphs ran out for the buckets %s: their beats "
                        "pad to the next bucket captured", skipped)
        log.info("captured %d beat graphs (%d buckets) in %.1f s; %.1f GB of device memory "
                 "free", len(self._graphs), len({k[0] for k in self._graphs}),
                 time.perf_counter() - t0, torch.cuda.mem_get_info()[0] / 1e9)
        self.start_rows_cost = self._time_start_rows(top)
        # what each row capture adds to a beat, and beats at full context (s), for a start
        # policy that budgets start work by them until it has measured its own
        self.start_row_s = {c: ms / 1e3 for c, ms in
                            self.start_rows_cost["added_ms_by_rows"].items()}
        if not sizing:
            self.slots["beat_ms_at_context"][top] = round(1e3 * self._beat_at_context(top), 2)
        self.beat_at_context_s = ({1: self._beat_at_context(1)} if (1, 0) in self._graphs
                                  else {}) | {int(n): ms / 1e3 for n, ms in
                                              self.slots["beat_ms_at_context"].items()}
        log.info("slots: %d (%s); memory holds %d; beat at full context: %s ms "
                 "(budget %.0f ms)", self.max_sessions, self.slots["decided_by"], ceiling,
                 self.slots["beat_ms_at_context"], self.slots["budget_ms"])

    @classmethod
    def build(cls, options: ExecutorOptions, clock: Clock | None = None) -> "GraphExecutor":
        return cls(options)

    def _build_model(self, char_table) -> VoiceChat:
        opts = self.options
        if opts.checkpoint:
            model = load_checkpoint(opts.checkpoint, self.cfg, self.profile, self.device,
                                    char_table)
        else:
            model = VoiceChat(self.cfg, self.profile, self.device, char_table)
            model.load(random_weights_on(self.cfg, self.device, opts.seed,
                                         load_dtype(self.cfg, self.profile)))
        torch.cuda.empty_cache()
        install(model, TritonDecodeOps())
        return model

    @property
    def model(self) -> VoiceChat:
        return self.runner.model

    @property
    def state(self):
        return self.runner.state

    def prompt_tokens(self, spec: SessionSpec) -> list[int]:
        return self.runner.prompt_tokens(self.text_codec, spec)

    @staticmethod
    def memory_ceiling(config: str, profile: str, max_context: int) -> int:
        return memory_ceiling(config, profile, max_context)

    def baseline(self, context: int) -> dict:
        """The stock way to serve: the eager reference model, one session at a time."""
        return measure_baseline(self.model, context)

    def reset(self) -> None:
        """Slot rows are reset behind a beat after their session closes (`plan.cleans`), or
        when their next session opens (`plan.resets`); a beat cut off by a clock restart is
        waited for before the new clock's first beat (`wait`)."""

    # -- host rings: pinned, so the clock packs straight into DMA-able memory -----------------------
    def _pin(self, shape: tuple, dtype: torch.dtype, fill=0) -> np.ndarray:
        t = torch.full(shape, fill, dtype=dtype, pin_memory=True)
        arr = t.numpy()
        self._pinned[arr.ctypes.data] = t
        return arr

    def alloc_input(self) -> BeatInput:
        return BeatInput(self._pin((self.max_sessions, FRAMES_PER_BEAT, SAMPLES_IN), torch.float32),
                         np.zeros(self.max_sessions, bool))

    def alloc_output(self, into: BeatOutput | None = None) -> BeatOutput:
        if into is not None:
            for name in OUTPUTS:
                self._register(getattr(into, name))
            return into
        s, f = self.max_sessions, FRAMES_PER_BEAT
        return BeatOutput(self._pin((s, f, SAMPLES_OUT), torch.float32),
                          self._pin((s, f), torch.int32), self._pin((s, f), torch.int32),
                          self._pin((s, f, MAX_USER_TOKENS), torch.int32, NO_TOKEN))

    def _register(self, arr: np.ndarray) -> None:
        """Host memory the caller owns (shared with the workers) page-locked for the driver,
        so the beat's copies into it are DMA as into our own pinned rings. Where the driver
        refuses, the copies still land, only synchronously."""
        if arr.ctypes.data in self._registered:          # a later clock's, same buffers
            return
        err = int(torch.cuda.cudart().cudaHostRegister(arr.ctypes.data, arr.nbytes, 0))
        if err:
            log.warning("cudaHostRegister of %d bytes failed (cudaError %d): outputs are "
                        "copied through pageable memory", arr.nbytes, err)
        else:
            self._registered.append(arr.ctypes.data)
        self._pinned[arr.ctypes.data] = torch.from_numpy(arr)

    def _tensor(self, arr: np.ndarray) -> torch.Tensor:
        """The pinned tensor behind a ring array (a plain view if it is not one of ours)."""
        t = self._pinned.get(arr.ctypes.data)
        return t if t is not None and t.shape == arr.shape else torch.from_numpy(arr)

    # -- the beat --------------------------------------------------------------------------------
    def submit(self, plan: BookPlan, inp: BeatInput, out: BeatOutput) -> None:
        self._done_s = None
        t0 = time.perf_counter()
        self._expect_first(plan, out)
        self._inflight = (self._worker.submit(self._launch, plan, inp, out), t0, plan)

    def _expect_first(self, plan: BookPlan, out: BeatOutput) -> None:
        """Before the beat is queued: the frame-0 count it must pass (the last beat's copies
        are done: its end waited for them)."""
        hi = max(plan.live, default=-1) + 1
        self._first_pending = (out, hi, int(self._first_seen_np[0])) if hi else None

    async def wait_first(self) -> None:
        """Polls the frame-0 count as `_device_done` polls the beat's end (with
        `first_poll_ms`: sleeps to the fastest recent frame 0, then polls at that interval,
        which spares the loop the spin's CPU at up to an interval's delay), then copies the
        live rows' frame 0 into `out`."""
        if self._inflight is None or self._first_pending is None:
            return
        out, hi, before = self._first_pending
        job, t0, plan = self._inflight
        key = (bucket_for(len(plan.live), self.max_sessions), len(plan.rows))
        recent = self._recent_first.setdefault(key, collections.deque(maxlen=8))
        fastest = min(recent, default=None)
        every = self.first_poll_s
        if fastest is not None:
            delay = t0 + fastest - (every or POLL_LEAD_S) - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        while int(self._first_seen_np[0]) == before:
            if job.done() and (job.exception() is not None or self._beat_done.query()):
                self._first_pending = None    # ended without frame 0: `wait` says why
                return
            await asyncio.sleep(every or (0 if fastest is not None else POLL_UNKNOWN_S))
        recent.append(time.perf_counter() - t0)
        for name, host in self._first_host.items():
            getattr(out, name)[:hi, 0] = host[:hi].numpy()
        self._first_pending = None

    async def wait(self) -> None:
        if self._inflight is None or self._done_s is not None:
            return
        job, t0, plan = self._inflight
        synced = await asyncio.wrap_future(job)             # the beat's work is queued
        launched = time.perf_counter() - t0
        if self.on_launched is not None:
            self.on_launched()
        if not synced:
            g = self._graph_for(len(plan.live), len(plan.rows))
            recent = self._recent.setdefault((g.bucket, g.start_rows),
                                             collections.deque(maxlen=8))
            await self._device_done(t0, min(recent, default=None))
            recent.append(1e-3 * self._beat_start.elapsed_time(self._beat_done))
            self.polled_beats += 1
        self._done_s = time.perf_counter() - t0
        self.beats_run += 1
        for name, a, b, n in self._timing:
            self.start_ms[name].append((a.elapsed_time(b), n))
        self._timing.clear()
        if self._done_s > BEAT_S:
            self.slow_beats.append(self._slow_beat(plan, launched, self._done_s))

    def _slow_beat(self, plan: BookPlan, launched: float, done: float) -> dict:
        stats = torch.cuda.memory_stats()
        return {"beat": self.beats_run, "live": len(plan.live), "rows": len(plan.rows),
                "resets": len(plan.resets), "rolls": len(plan.roll),
                "launch_ms": round(1e3 * launched, 1), "done_ms": round(1e3 * done, 1),
                "allocator": {k: stats.get(k) for k in ALLOCATOR_COUNTS}}

    def collect(self, plan: BookPlan, out: BeatOutput) -> float:
        job, _t0, _plan = self._inflight
        self._inflight = None
        job.result()
        return self._done_s

    def _launch(self, plan: BookPlan, inp: BeatInput, out: BeatOutput) -> bool:
        """Worker thread: the beat's device work enqueued (resets, the replay, the copies), its
        end marked by `_beat_done`; with beat_wait "thread", waited for here. Returns whether it
        waited."""
        t0 = time.perf_counter()
        self._beat_start.record()
        with torch.no_grad():
            self._timed("reset", len(plan.resets), self.runner.reset_slots, plan)
            self._timed("copy", len(plan.copies), self.runner.snapshots.copy_in, plan.copies)
            if plan.live or plan.rows:
                self._enqueue(plan, inp, out)
            if plan.started and self.options.context_offset:
                self._prefill_context(plan.started)
        self._beat_done.record()
        with torch.no_grad():
            self.runner.save(plan)              # behind the rows that made them
            self.runner.roll(plan)          # behind the beat's work: outputs do not wait for it
            self.runner.clean(plan)
        self.launch_s.append(time.perf_counter() - t0)
        if not self.poll:
            self._beat_done.synchronize()
        return not self.poll

    async def _device_done(self, t0: float, fastest: float | None) -> None:
        """Return once `_beat_done` has passed: asleep for most of the beat, then asking every
        loop iteration (the tasks that are ready run in between, as they would anyway). The
        device began the beat no earlier than t0, so a beat that takes `fastest` on the device
        cannot end before t0 + fastest: the sleep never outlasts the beat."""
        if fastest is not None:
            delay = t0 + fastest - POLL_LEAD_S - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        while not self._beat_done.query():
            await asyncio.sleep(0 if fastest is not None else POLL_UNKNOWN_S)

    def _enqueue(self, plan: BookPlan, inp: BeatInput, out: BeatOutput) -> None:
        """The ring's audio rows up to the highest live slot to the device, the rows' slots and
        per-row values into the bucket's buffers, the replay, the output rows back into the
        output ring: all queued on the device, nothing waited for."""
        n, hi = len(plan.live), max(plan.live, default=-1) + 1
        g = self._graph_for(n, len(plan.rows))
        self._fill_rows(g, plan)
        for k, t in g.d_in.items():
            t.copy_(g.h_in[k], non_blocking=True)
        if hi:
            self.d_audio[:hi].copy_(self._tensor(inp.audio)[:hi], non_blocking=True)
        if g.graph is not None:
            g.graph.replay()
        else:
            self._beat_body(g)
        for name in OUTPUTS:
            if hi:
                self._tensor(getattr(out, name))[:hi].copy_(self.d_out[name][:hi],
                                                            non_blocking=True)

    def _fill_rows(self, g: _Captured, plan: BookPlan) -> None:
        """The plan's rows into the capture's pinned inputs: the live slots (padded rows point at
        the trash slot) with their per-row values, and the start rows' prompt chunks."""
        n = len(plan.live)
        h = g.h_in
        h["slots"][:n] = torch.from_numpy(np.asarray(plan.live, np.int64))
        h["slots"][n:] = self.trash
        h["forced"][:n] = torch.from_numpy(plan.forced)
        h["forced"][n:] = -1
        h["session"][:n] = torch.from_numpy(plan.session)
        h["frame0"][:n] = torch.from_numpy(plan.frame0)
        if g.start_rows:
            slots, tokens, valid = self.runner.row_tokens(plan.rows, g.start_rows, self.trash)
            h["row_slots"][:] = torch.from_numpy(slots)
            h["row_tokens"][:] = torch.from_numpy(tokens)
            h["row_valid"][:] = torch.from_numpy(valid)

    def _prefill_context(self, slots: list[int]) -> None:
        """Model a session that already spoke for `context_offset` frames: its caches hold that
        many positions. The rows stay as the reset left them: the work of a frame depends only
        on the lengths, and filling them would need gigabytes of temporaries a beat on a device
        planned to its memory ceiling. Queued behind the beat that finished its prompt."""
        n = self.options.context_offset
        idx = torch.tensor(slots, device=self.device)
        self.state.thinker.length[idx] += n
        self.state.talker.position[idx] += n

    def prepare(self, sessions: int, optional: bool = False) -> bool:
        """Capture the bucket that `sessions` live sessions use, with each row capture
        (outside any beat); `optional`: False when memory ran out first (the bucket's graphs
        made so far are dropped: a beat then uses a larger bucket)."""
        b = bucket_for(sessions, self.max_sessions)
        for rows in self.start_shape.row_captures:
            if (b, rows) not in self._graphs and self._capture(b, rows, optional) is None:
                for r in self.start_shape.row_captures:
                    self._graphs.pop((b, r), None)
                return False
        return True

    def _graph_for(self, n: int, rows: int) -> _Captured:
        """The smallest captured bucket that holds n sessions, with the smallest row capture
        that holds `rows` start rows (extra rows are padding)."""
        cap = self.start_shape.capture_for(rows)
        return self._graphs[min(b for b, r in self._graphs if b >= n and r == cap), cap]

    def _beat_body(self, g: _Captured) -> None:
        """What one replay does: gather the bucket's audio rows by slot, two frames, scatter the
        outputs by slot (padded rows read and write the trash row). The trash slot's counters
        restart each beat so padded rows never run off its caches. cuDNN stays on for the
        convolutions (perception, codec); the RNNT turns it off for its LSTM. With `streams` the
        frames' independent stages overlap (beat_streams.py); without, they run in order on one
        stream (the same kernels: outputs equal bit for bit)."""
        st, d, t = self.state, g.d_in, self.trash
        st.thinker.length[t:t + 1].fill_(0)            # slices: a graph captures no host copy
        st.talker.position[t:t + 1].fill_(self.cfg.talker.n_warmup)
        torch.index_select(self.d_audio, 0, d["slots"], out=g.audio)
        noise_of = lambda f: self.model.noise(self.options.seed, d["session"], d["frame0"] + f)  # noqa: E731

        def emit(f: int, o) -> None:
            for name in OUTPUTS:
                dst = self.d_out[name][:, f]
                dst.index_copy_(0, d["slots"], getattr(o, name).to(dst.dtype))
            if f == 0:
                self._first_out()

        if self.streamed is not None:
            self.streamed.run(st, g.audio, d["slots"], noise_of, d["forced"], emit)
        else:
            self.model.frames(st, g.audio, d["slots"], noise_of, d["forced"], emit)
        if g.start_rows:
            # the starting slots' next prompt chunks: they share no slot with the live rows
            # (padded rows write the trash slot, which nothing reads)
            window = st.window(self._prompt_window, st.talker.max_positions)
            self.model.prefill_chunk(window, d["row_slots"], d["row_tokens"], d["row_valid"])
        torch.cuda.current_stream().wait_stream(self._first_stream)    # joined: a capture ends

    def _first_out(self) -> None:
        """Inside the beat, after frame 0's outputs are written: every slot's frame-0 rows to
        pinned memory, then the frame-0 count after them, on a side stream (frame 1 does not
        wait). One stream orders the copies, so a host that sees the count sees the rows."""
        side = self._first_stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for name, dev in self._first_dev.items():
                dev.copy_(self.d_out[name][:, 0])
                self._first_host[name].copy_(dev, non_blocking=True)
            self._first_count.add_(1)
            self._first_seen.copy_(self._first_count, non_blocking=True)

    def _capture(self, bucket: int, rows: int, optional: bool = False) -> _Captured | None:
        """The bucket's beat graph with `rows` start rows. `optional`: one of the ladder below
        the top, given up (None) when its warm-up finds no memory."""
        t0 = time.perf_counter()
        g = _Captured(bucket, self.device, rows, self.start_shape.prefill_chunk)
        g.d_in["slots"].fill_(self.trash)
        g.d_in["forced"].fill_(-1)
        if rows:
            g.d_in["row_slots"].fill_(self.trash)
        if not self.capture:                         # eager mode: the buffers, no graph
            self._graphs[bucket, rows] = g
            return g
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.use_mem_pool(self._mempool), torch.cuda.stream(side), \
                    torch.no_grad():
                for _ in range(2):                   # JIT-compile kernels, pick BLAS algorithms
                    self._beat_body(g)
        except torch.OutOfMemoryError:
            if not optional:
                raise
            torch.cuda.synchronize()
            return None                              # before the capture: nothing half-made
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g.graph, pool=self._pool), torch.no_grad():
            self._beat_body(g)
        self._graphs[bucket, rows] = g
        log.info("captured the beat graph for %d sessions%s in %.1f s (%.2f GB free, %.2f GB "
                 "reserved)", bucket, f" with {g.start_rows} start rows" if rows else "",
                 time.perf_counter() - t0, torch.cuda.mem_get_info()[0] / 1e9,
                 torch.cuda.memory_reserved() / 1e9)
        return g

    def _warm_eager(self) -> None:
        """The eager work a beat may queue (a reset with the talker's warm-up, a snapshot copy
        and save, a context roll) run once on the trash slot before serving: their first run
        loads kernels and builds the roll's turn tables, which would land in a live beat."""
        t = self.trash
        idx = slice(t, t + 1)           # as `ModelRunner.reset_slots` resets a run of slots
        with torch.no_grad():
            self.state.reset(idx)
            self.model.warm(self.state, idx)
            if self.snapshot_space.entries:
                self.runner.snapshots.save([(t, 0, self.start_shape.prefill_chunk)])
                self.runner.snapshots.copy_in([(t, 0, self.start_shape.prefill_chunk)])
            self.model.roll(self.state, t, 1, self.options.roll_frames)
            self.state.reset(idx)
            self.model.warm(self.state, idx)
            # scattered resets (calls coming and going) replay one of these
            self.runner.resets.capture(self._pool, t)
            self.runner.snapshots.capture(self._pool, t)    # and scattered copies
        torch.cuda.synchronize()

    def _size_slots(self, most: int, ceiling: int) -> dict:
        """The most sessions, at most `most` (the memory `ceiling`, or the largest bucket), whose
        beat at full context the device runs within ON_TIME_SHARE of a beat (start rows and
        snapshot copies ride in a beat only where they fit: the start policy's budget):
        measured at `most` and at half of it, a line through the two (past the weight reads a
        beat's time grows with its rows) gives a count, and the count is measured in turn until
        it fits. Graphs above it are dropped."""
        budget = ON_TIME_SHARE * BEAT_S
        probes: dict[int, float] = {}

        def fits(n: int) -> bool:
            if n not in probes:
                probes[n] = self._beat_at_context(n)
            return probes[n] <= budget

        n = most
        if not fits(n) and n > 1:
            lo = max(1, n // 2)
            fits(lo)
            slope = max(probes[n] - probes[lo], 1e-6) / max(n - lo, 1)
            n = max(1, min(n - 1, lo + int((budget - probes[lo]) / slope)))
            for _ in range(4):          # the line is an estimate; the device has the last word
                if fits(n) or n == 1:
                    break
                n = max(1, min(n - 1, int(n * budget / probes[n])))
        for key in [k for k in self._graphs if k[0] > n]:
            del self._graphs[key]
        return {"sessions": n, "decided_by": f"the beat without start rows at full context within "
                f"{ON_TIME_SHARE:.0%} of {1e3 * BEAT_S:.0f} ms, under the memory ceiling",
                "memory_ceiling": ceiling, "budget_ms": round(1e3 * budget, 1),
                "beat_ms_at_context": {k: round(1e3 * v, 2) for k, v in sorted(probes.items())}}

    def _fastest_replay(self, g: _Captured, replays: int, before=None) -> float:
        """The device time of `g`'s beat, the fastest of `replays` replays (eagerly without a
        graph); `before()` runs ahead of each, outside the timed part."""
        best = math.inf
        for _ in range(replays):
            if before is not None:
                before()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            if g.graph is not None:
                g.graph.replay()
            else:
                with torch.no_grad():
                    self._beat_body(g)
            b.record()
            b.synchronize()
            best = min(best, a.elapsed_time(b) / 1e3)
        return best

    def _beat_at_context(self, n: int, replays: int = 3, rows: int = 0) -> float:
        """The device time of the n-session beat (with `rows` start rows, padded) when every one
        of its sessions' caches is full: the fastest of a few replays. What it writes belongs
        to no session (every open resets its slot)."""
        if (n, rows) not in self._graphs:
            self._capture(n, rows)
        g = self._graphs[n, rows]
        st = self.state

        def full_caches() -> None:       # each replay advances them: set again before each
            st.thinker.length[:n] = st.thinker.max_positions - FRAMES_PER_BEAT
            st.talker.position[:n] = st.talker.max_positions - FRAMES_PER_BEAT
        g.d_in["slots"].copy_(torch.arange(n, device=self.device))
        best = self._fastest_replay(g, replays, full_caches)
        g.d_in["slots"].fill_(self.trash)
        st.thinker.length.zero_()
        st.talker.position.zero_()
        return best

    def _time_start_rows(self, bucket: int, replays: int = 5) -> dict:
        """What the start rows add to the `bucket`-session beat, replayed on the idle device
        (all rows padded: the same kernels as rows in use), the fastest of a few replays each."""
        def fastest(g: _Captured) -> float:
            return self._fastest_replay(g, replays)
        shape = self.start_shape
        plain = fastest(self._graphs[bucket, 0])
        added = {c: round(1e3 * (fastest(self._graphs[bucket, c]) - plain), 2)
                 for c in shape.row_captures if c}
        cost = {"rows": shape.start_rows, "chunk": shape.prefill_chunk,
                "at_sessions": bucket, "beat_ms": round(1e3 * plain, 2),
                "beat_with_rows_ms": round(1e3 * plain + added[shape.start_rows], 2),
                "added_ms": added[shape.start_rows], "added_ms_by_rows": added}
        log.info("start rows: %d rows of %d prompt positions add %.1f ms to the %d-session beat "
                 "(%.1f ms without, idle caches)", cost["rows"], cost["chunk"], cost["added_ms"],
                 bucket, cost["beat_ms"])
        return cost

    def describe(self) -> dict:
        free, total = torch.cuda.mem_get_info()
        return self.runner.facts(self.name, self.text_codec, self.profile) | {
                "gpu": torch.cuda.get_device_name(0),
                "weights_bytes": self.plan_memory.weights,
                "state_bytes_per_session": self.plan_memory.per_session,
                "memory_used_bytes": total - free,
                "memory_total_bytes": total,
                "memory_ceiling_sessions": self.plan_memory.ceiling(total),
                "max_sessions": self.max_sessions, "slots": self.slots,
                "beat_wait": "poll" if self.poll else "thread", "beats_polled": self.polled_beats,
                "first_poll_ms": self.first_poll_s * 1e3,
                "buckets_captured": sorted({b for b, _ in self._graphs}),
                "launch_ms": spread_ms(self.launch_s),
                "allocator": {k: torch.cuda.memory_stats().get(k) for k in ALLOCATOR_COUNTS},
                "beats_run": self.beats_run, "slow_beats": list(self.slow_beats),
                "start_rows": self.start_rows_cost,
                "snapshots": self.snapshot_facts()}

    def snapshot_facts(self) -> dict:
        """The snapshot rows' memory and what a copy-start cost the beats it rode in: the
        device time of the beat's copies, per copy (its slot's reset, as every start's, apart)."""
        def per(name: str) -> dict:
            beats = self.start_ms[name]
            return {"beats": len(beats), "sessions": sum(n for _, n in beats),
                    "ms_per_session": spread_ms([ms / n / 1e3 for ms, n in beats])
                    if beats else {}}
        return {"device_bytes": self.runner.snapshots.nbytes(),
                "entries": self.snapshot_space.entries, "copy": per("copy"),
                "reset": per("reset")}

    def _timed(self, name: str, n: int, fn, arg) -> None:
        """fn(arg) between two device events when it has n > 0 things to do (read at the
        beat's end: no wait here)."""
        if not n:
            return
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(arg)
        b.record()
        self._timing.append((name, a, b, n))

    def close(self) -> None:
        self._worker.shutdown(wait=True)
        torch.cuda.synchronize()
        for ptr in self._registered:
            torch.cuda.cudart().cudaHostUnregister(ptr)
            self._pinned.pop(ptr, None)
        self._registered.clear()
