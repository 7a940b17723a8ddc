"""The `graph` backend: the full model on one GPU, every live session advanced together, two
frames per beat as one CUDA-graph replay.

It is the cpu backend's session bookkeeping (prompt prefill and talker warm-up in bounded
chunks, forced function tokens, out-of-context handling) over a different executor:
  - weights drawn on the device (or loaded), state preallocated for `max_sessions` + 1 slots at
    start; the extra slot is a trash row that padded batch entries write into;
  - the model's decode hooks routed to the Triton kernels (`decode_ops`), so per-session state is
    updated in place and attention reads only the context in use;
  - one graph per batch-size bucket, captured on first use; a beat copies the live slots'
    inputs into the bucket's static buffers (one host→device copy of pinned memory), replays,
    and copies the outputs back (one device→host copy); no per-session Python on the GPU path;
  - a configuration that does not fit in device memory is refused at start, saying why.
Prefill and warm-up chunks run eagerly on the same stream before the beat's replay.

How a beat waits for the GPU (`BackendOptions.beat_wait`): the worker thread only enqueues the
beat (copies, replay) and returns while the GPU works; the event loop then sleeps until just
before the fastest recent beat of this bucket would end and asks the beat's CUDA event whether
it is done once per loop iteration ("poll"). The worker used to wait on the device itself
("thread"), and its result then needed the GIL back while the loop ran the session actors (up to
a 0.5 ms switch interval for each of its torch calls after the wait) and two loop iterations to
resume the beat: ~3 ms from the GPU's end to routed outputs at 120 sessions, 5 ms at p99. Beats
that start sessions keep the thread: their eager chunks are timed on the worker.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import math
import time

import numpy as np
import torch

from gpu.engine.beat_streams import StreamedBeat
from gpu.engine.cpu_backend import CpuBackend, _Plan
from gpu.engine.decode_ops import TritonDecodeOps, install
from gpu.engine.start_budget import StartBudget
from gpu.model.checkpoint import load_checkpoint
from gpu.model.config import Profile, VoiceChatConfig
from gpu.model.voicechat import VoiceChat
from gpu.model.voicechat_state import session_state_bytes
from gpu.model.voicechat_weights import load_dtype, param_shapes, random_weights_on
from wave_actors.backend import NO_TOKEN, BeatInput, BeatOutput
from wave_actors.backends import BackendOptions
from wave_actors.frames import FRAMES_PER_BEAT, SAMPLES_IN, SAMPLES_OUT

log = logging.getLogger("wave.graph_backend")

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448,
           512)
# Activations, graph pools, logits, CUDA context. MODEL.md §4 budgets a flat 4 GB, but the beat
# graph's activations grow with the batch: measured on the H200, 3.6 GB at 97 slots (reference)
# and 4.2 GB at 129 (dense), and the capture for 124 reference slots ran out of memory with 4 GB
# left. So: a base plus a share per slot, with margin over the measured slope (~19 MB).
WORKSPACE_BASE = 2.5e9
WORKSPACE_PER_SLOT = 25e6
GRAPH_MAX_PROMPT = 512       # thinker positions reserved for the system prompt on the GPU
STARTS_PER_STEP = 16         # sessions whose prefill / warm-up chunk runs in one start step (a
                             # chunk is launch-bound: 16 rows cost about what 8 do)
GRAPH_PREFILL_CHUNK = 16     # prompt positions per start chunk: an eager chunk's cost is launches
POLL_LEAD_S = 1.5e-3         # poll the beat's event from this long before the fastest recent beat
POLL_UNKNOWN_S = 5e-4        # a bucket's first beats (no time known): poll at this interval


def bucket_for(n: int, max_sessions: int) -> int:
    for b in BUCKETS:
        if b >= n:
            return min(b, max_sessions)
    return max_sessions


class MemoryPlan:
    """What the configuration needs on the device, decided before anything is allocated."""

    def __init__(self, cfg: VoiceChatConfig, profile: Profile, max_sessions: int,
                 max_context: int, max_prompt: int):
        dtype_of = load_dtype(cfg, profile)
        self.weights = sum(math.prod(s) * dtype_of(n).itemsize for n, s in param_shapes(cfg).items())
        self.per_session = session_state_bytes(cfg, profile, max_context, max_prompt)["total"]
        self.sessions = max_sessions + 1                     # + the trash slot
        self.state = self.per_session * self.sessions
        self.workspace = WORKSPACE_BASE + WORKSPACE_PER_SLOT * self.sessions
        self.total = self.weights + self.state + self.workspace

    def ceiling(self, free: float) -> int:
        per_slot = self.per_session + WORKSPACE_PER_SLOT
        return max(0, int((free - self.weights - WORKSPACE_BASE) // per_slot) - 1)

    def check(self, free: float) -> None:
        if self.total > free:
            raise MemoryError(
                f"{self.sessions - 1} sessions at this context need {self.total / 1e9:.1f} GB "
                f"(weights {self.weights / 1e9:.1f} + state {self.per_session / 1e6:.1f} MB × "
                f"{self.sessions} + workspace {self.workspace / 1e9:.1f}); the device has "
                f"{free / 1e9:.1f} GB free: at most {self.ceiling(free)} sessions fit")


def _pinned(shape: tuple, dtype: torch.dtype) -> np.ndarray:
    """A numpy view of page-locked host memory (the tensor stays alive through the view)."""
    return torch.zeros(shape, dtype=dtype, pin_memory=True).numpy()


def memory_ceiling(config: str, profile: str, max_context: int,
                   max_prompt: int = GRAPH_MAX_PROMPT) -> int:
    """Sessions that fit in the device's free memory now at `max_context` frames."""
    plan = MemoryPlan(VoiceChatConfig.named(config), Profile.named(profile), 1, max_context,
                      max_prompt)
    return plan.ceiling(torch.cuda.mem_get_info()[0])


class _Captured:
    """One bucket's graph with its static device buffers and their pinned host twins."""

    def __init__(self, bucket: int, device: torch.device):
        z = lambda *shape, dtype=torch.float32: torch.zeros(*shape, dtype=dtype, device=device)
        pin = lambda t: torch.zeros(t.shape, dtype=t.dtype, pin_memory=True)
        self.bucket = bucket
        self.d_in = {"slots": z(bucket, dtype=torch.long), "audio": z(bucket, 2, SAMPLES_IN),
                     "forced": z(bucket, 2, dtype=torch.long), "session": z(bucket, dtype=torch.long),
                     "frame0": z(bucket, dtype=torch.long)}
        self.d_out = {"pcm": z(bucket, 2, SAMPLES_OUT), "text": z(bucket, 2, dtype=torch.long),
                      "func": z(bucket, 2, dtype=torch.long), "user": z(bucket, 2, 10, dtype=torch.long)}
        self.h_in = {k: pin(v) for k, v in self.d_in.items()}
        self.h_out = {k: pin(v) for k, v in self.d_out.items()}
        self.graph: torch.cuda.CUDAGraph | None = None


class GraphBackend(CpuBackend):
    name = "graph"
    reports_launch = True
    starts_per_step = STARTS_PER_STEP
    prefill_chunk = GRAPH_PREFILL_CHUNK

    def __init__(self, opts: BackendOptions, capture: bool = True, streams: bool = True):
        """capture=False runs the same beat body eagerly instead of replaying its graph, and
        streams=False runs a beat's stages in order on one stream: the same kernels on the same
        batch either way, so the outputs must equal the default's bit for bit (the same-precision
        parity checks of bench/graph_check.py)."""
        self.capture = capture
        if not torch.cuda.is_available():
            raise RuntimeError("the graph backend needs a CUDA device; use --backend cpu or sim")
        self.device = torch.device("cuda")
        self.max_prompt = GRAPH_MAX_PROMPT
        # Session starts run eagerly after the replay: only in beats with room for them.
        self.start_budget = StartBudget()
        cfg = VoiceChatConfig.named(opts.config)
        profile = Profile.named(opts.profile)
        self.max_context = opts.max_context
        self.plan_memory = MemoryPlan(cfg, profile, opts.max_sessions, opts.max_context,
                                      self.max_prompt)
        self.plan_memory.check(torch.cuda.mem_get_info()[0])
        torch.backends.cuda.matmul.allow_tf32 = profile.tf32
        torch.backends.cudnn.allow_tf32 = profile.tf32
        super().__init__(opts)
        # Frames a session may still run: its caches also hold the pre-filled context.
        self.max_context = opts.max_context - opts.context_offset
        if self.max_context < 2 * FRAMES_PER_BEAT:
            raise ValueError(f"context offset {opts.context_offset} leaves no room in "
                             f"{opts.max_context} frames")
        self.trash = opts.max_sessions
        self._graphs: dict[int, _Captured] = {}
        self._pool = torch.cuda.graph_pool_handle()
        self.streamed = StreamedBeat(self.model, self.device) if streams else None
        self.context_offset = opts.context_offset
        self.timings: list[float] = []
        if opts.beat_wait not in ("poll", "thread"):
            raise ValueError(f"beat_wait {opts.beat_wait!r}: choose poll or thread")
        self.poll = opts.beat_wait == "poll"
        self._beat_done = torch.cuda.Event()
        self._recent: dict[int, collections.deque] = {}      # bucket → recent polled beat times
        self.polled_beats = 0
        # The largest bucket is captured now, so no beat ever waits for a capture; smaller ones
        # (less padding) are captured between beats by `prepare`.
        self._capture(bucket_for(self.max_sessions, self.max_sessions))

    # -- host buffers: pinned, so the clock packs straight into DMA-able memory --------------------
    def alloc_input(self) -> BeatInput:
        return BeatInput(_pinned((self.max_sessions, FRAMES_PER_BEAT, SAMPLES_IN), torch.float32),
                         np.zeros(self.max_sessions, bool))

    def alloc_output(self) -> BeatOutput:
        s, f = self.max_sessions, FRAMES_PER_BEAT
        out = BeatOutput(_pinned((s, f, SAMPLES_OUT), torch.float32), _pinned((s, f), torch.int32),
                         _pinned((s, f), torch.int32), _pinned((s, f, 10), torch.int32))
        out.user[:] = NO_TOKEN
        return out

    # -- construction hooks of the cpu backend -------------------------------------------------------
    def _build_model(self, opts: BackendOptions, char_table):
        if opts.checkpoint:
            model = load_checkpoint(opts.checkpoint, self.cfg, self.profile, self.device, char_table)
        else:
            model = VoiceChat(self.cfg, self.profile, self.device, char_table)
            model.load(random_weights_on(self.cfg, self.device, opts.seed,
                                         load_dtype(self.cfg, self.profile)))
        torch.cuda.empty_cache()
        install(model, TritonDecodeOps())
        return model

    def _alloc_state(self, opts: BackendOptions):
        return self.model.alloc_state(opts.max_sessions + 1, opts.max_context, self.max_prompt)

    # -- the beat --------------------------------------------------------------------------------
    def _compute(self, plan: _Plan, out: BeatOutput) -> float:
        t0 = time.perf_counter()
        super()._compute(plan, out)
        if plan.started and self.context_offset:
            self._prefill_context(plan.started)
        torch.cuda.current_stream().synchronize()
        elapsed = time.perf_counter() - t0
        self.timings.append(elapsed)
        return elapsed

    def _sync(self) -> None:
        torch.cuda.current_stream().synchronize()

    def _prefill_context(self, slots: list[int]) -> None:
        """Model a session that already spoke for `context_offset` frames: its caches hold that
        many positions (random rows; the work of a frame depends only on the lengths)."""
        th, tk, n = self.state.thinker, self.state.talker, self.context_offset
        for s in slots:                      # basic slices: views, so normal_ writes the state
            start = int(th.length[s])
            th.k[:, s, start:start + n].normal_()
            th.v[:, s, start:start + n].normal_()
            pos = int(tk.position[s])
            tk.k[s, :, :, :, pos:pos + n].normal_()
            tk.v[s, :, :, :, pos:pos + n].normal_()
        idx = torch.tensor(slots, device=self.device)
        th.length[idx] += n
        tk.position[idx] += n

    def prepare(self, sessions: int) -> None:
        """Capture the bucket that `sessions` live sessions use (outside any beat)."""
        b = bucket_for(sessions, self.max_sessions)
        if b not in self._graphs:
            self._capture(b)

    def _graph_for(self, n: int) -> _Captured:
        """The smallest captured bucket that holds n sessions (extra rows are padding)."""
        return self._graphs[min(b for b in self._graphs if b >= n)]

    async def _run_plan(self, plan: _Plan, out: BeatOutput) -> BeatOutput:
        if not (self.poll and plan.live) or plan.starts or plan.started:
            self._launched()                 # the worker waits on the device: the loop is free
            return await super()._run_plan(plan, out)
        t0 = time.perf_counter()
        g = await asyncio.get_running_loop().run_in_executor(self._executor, self._launch, plan)
        self._launched()
        recent = self._recent.setdefault(g.bucket, collections.deque(maxlen=8))
        await self._device_done(t0, min(recent, default=None))
        self._collect(plan, g, out)
        self._silence_spent(plan, out)
        out.compute_s = elapsed = time.perf_counter() - t0
        recent.append(elapsed)
        self.polled_beats += 1
        self.timings.append(elapsed)
        self.start_budget.observe_live(len(plan.live), elapsed)
        return out

    def _launched(self) -> None:
        if self.on_launched is not None:
            self.on_launched()

    def _launch(self, plan: _Plan) -> _Captured:
        """Worker thread: the beat's device work enqueued, its end marked by `_beat_done`."""
        with torch.no_grad():
            self._reset_and_rewind(plan)
            g = self._enqueue(plan)
        self._beat_done.record()
        return g

    async def _device_done(self, t0: float, fastest: float | None) -> None:
        """Return once `_beat_done` has passed: asleep for most of the beat, then asking every
        loop iteration (the tasks that are ready run in between, as they would anyway)."""
        if fastest is not None:
            delay = t0 + fastest - POLL_LEAD_S - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        while not self._beat_done.query():
            await asyncio.sleep(0 if fastest is not None else POLL_UNKNOWN_S)

    def _frames(self, plan: _Plan, out: BeatOutput) -> None:
        g = self._enqueue(plan)
        torch.cuda.current_stream().synchronize()
        self._collect(plan, g, out)

    def _enqueue(self, plan: _Plan) -> _Captured:
        """The live slots' inputs into the bucket's buffers, the replay, the outputs' copy back:
        all queued on the device, nothing waited for."""
        n = len(plan.live)
        g = self._graph_for(n)
        h = g.h_in
        h["slots"][:n] = torch.from_numpy(np.asarray(plan.live, np.int64))
        h["slots"][n:] = self.trash
        h["audio"][:n] = torch.from_numpy(plan.audio)
        h["audio"][n:] = 0.0
        h["forced"][:n] = torch.from_numpy(plan.forced)
        h["forced"][n:] = -1
        h["session"][:n] = torch.from_numpy(plan.session)
        h["frame0"][:n] = torch.from_numpy(plan.frame0)
        for k, t in g.d_in.items():
            t.copy_(h[k], non_blocking=True)
        if g.graph is not None:
            g.graph.replay()
        else:
            with torch.no_grad():
                self._beat_body(g)
        for k, t in g.d_out.items():
            g.h_out[k].copy_(t, non_blocking=True)
        return g

    @staticmethod
    def _collect(plan: _Plan, g: _Captured, out: BeatOutput) -> None:
        """The finished beat's rows from the bucket's pinned outputs into `out`."""
        live, n = plan.live, len(plan.live)
        out.pcm[live] = g.h_out["pcm"][:n].numpy()
        out.text[live] = g.h_out["text"][:n].numpy()
        out.func[live] = g.h_out["func"][:n].numpy()
        out.user[live] = g.h_out["user"][:n].numpy()

    def _beat_body(self, g: _Captured) -> None:
        """What one replay does: two frames for the bucket's slots, outputs into static buffers.
        The trash slot's counters restart each beat so padded rows never run off its caches.
        cuDNN stays on for the convolutions (perception, codec): without it they cost 5x more
        per session (bench/results/graph-stages-*.json); the RNNT turns it off for its LSTM.
        With `streams` the frames' independent stages overlap (beat_streams.py); without, they
        run in order on one stream (the same kernels: outputs equal bit for bit)."""
        st, d, t = self.state, g.d_in, self.trash
        st.thinker.length[t:t + 1].fill_(0)            # slices: a graph captures no host copy
        st.talker.position[t:t + 1].fill_(self.cfg.talker.n_warmup)
        noise_of = lambda f: self.model.noise(self.opts.seed, d["session"], d["frame0"] + f)  # noqa: E731

        def emit(f: int, o) -> None:
            g.d_out["pcm"][:, f].copy_(o.pcm)
            g.d_out["text"][:, f].copy_(o.text)
            g.d_out["func"][:, f].copy_(o.func)
            g.d_out["user"][:, f].copy_(o.user)

        if self.streamed is not None:
            self.streamed.run(st, d["audio"], d["slots"], noise_of, d["forced"], emit)
            return
        self.model.frames(st, d["audio"], d["slots"], noise_of, d["forced"], emit)

    def _capture(self, bucket: int) -> _Captured:
        t0 = time.perf_counter()
        g = _Captured(bucket, self.device)
        g.d_in["slots"].fill_(self.trash)
        g.d_in["forced"].fill_(-1)
        if not self.capture:                         # eager mode: the buffers, no graph
            self._graphs[bucket] = g
            return g
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):                       # JIT-compile kernels, pick BLAS algorithms
                self._beat_body(g)
        torch.cuda.current_stream().wait_stream(side)
        g.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g.graph, pool=self._pool), torch.no_grad():
            self._beat_body(g)
        self._graphs[bucket] = g
        log.info("captured the beat graph for %d sessions in %.1f s", bucket,
                 time.perf_counter() - t0)
        return g

    def describe(self) -> dict:
        free, total = torch.cuda.mem_get_info()
        return super().describe() | {
            "gpu": torch.cuda.get_device_name(0),
            "weights_bytes": self.plan_memory.weights,
            "state_bytes_per_session": self.plan_memory.per_session,
            "memory_used_bytes": total - free,
            "memory_total_bytes": total,
            "memory_ceiling_sessions": self.plan_memory.ceiling(total),
            "start_beats_held_back": self.start_budget.held_back,
            "start_step_ms": (round(1e3 * self.start_budget.expected_start(), 2)
                              if self.start_budget.recent_start_s else None),   # measured
            "starts_refused_no_room": self.start_budget.given_up,
            "beat_wait": "poll" if self.poll else "thread", "beats_polled": self.polled_beats,
            "buckets_captured": sorted(self._graphs)}
