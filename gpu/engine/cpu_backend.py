"""The `cpu` backend: the reference VoiceChat model on the CPU (tiny config by default).

A beat, in order: (1) on the event loop, the host bookkeeping turns slot phases into a plan — which
slots to reset, which run their two frames (with their forced function tokens and noise keys),
which advance their session start by one bounded chunk (≤ 64 prompt positions into the thinker,
≤ 8 talker warm-up positions); (2) in one worker thread, the model runs the plan: the live slots'
frames batched, then the start chunks; (3) the worker writes the outputs into `BeatOutput`.
The event loop stays free while the worker computes. A slot is `ready` once its prompt and its
37 (tiny: 8) warm-up positions are in, so a session's start costs several beats but never one
long step.

Every count the plan needs (prompt progress, warm-up progress, frames run) lives on the host, so
the model step never synchronises. The KV caches are sized for `max_context` frames; each call
runs on a window of them rounded up to 64 positions past the longest session in the call, which
keeps the eager attention cost proportional to the context in use (results identical, see
`VoiceChatState.window`). A session that has run `max_context` frames is out of context: it gets
silence and PAD from then on (logged once), until it is closed. A benchmark instead sets
`context_hold`: such a session steps back that many positions (thinker and talker; the caches keep
their rows) and runs on, so its context stays within `context_hold` frames of `max_context` for
as many beats as the run lasts.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from gpu.engine.start_budget import StartBudget, StartQueue
from gpu.model.checkpoint import available_host_memory, load_checkpoint
from gpu.model.config import Profile, VoiceChatConfig
from gpu.model.prompt import MAX_TOOLS, prompt_tokens
from gpu.model.talker_text import CharTable
from gpu.model.tokenizer import EOS, PAD, UserByteFallbackCodec, load_text_codec
from gpu.model.voicechat import VoiceChat
from gpu.model.voicechat_state import session_state_bytes
from gpu.model.voicechat_weights import param_shapes
from wave_actors.backend import Backend, BeatInput, BeatOutput, NO_TOKEN, SessionSpec
from wave_actors.backends import BackendOptions
from wave_actors.frames import FRAMES_PER_BEAT

log = logging.getLogger("wave.cpu_backend")

PREFILL_CHUNK = 64          # prompt positions a starting slot prefills per beat
WARMUP_CHUNK = 8            # talker warm-up positions a starting slot runs per beat
MAX_PROMPT = 2048           # thinker positions reserved for [bos] + system prompt + [eos]
WINDOW_STEP = 64            # KV windows are multiples of this many positions
VOCAB_PROBE = "Hello! How is the weather in Zürich today? Call get_weather({\"city\": \"Paris\"})."
THREADS = 1                 # torch intra-op threads: tiny ops lose more to threading than they gain


@dataclass
class _Slot:
    """Host bookkeeping of one slot. phase: closed → starting → live → spent (out of context);
    a start may also be refused, which leaves it starting until closed (`StartQueue`)."""
    phase: str = "closed"
    session: int = 0                    # incarnation number: the noise key of this session
    prompt: list[int] = field(default_factory=list)
    prompt_done: int = 0                # thinker positions prefilled
    warm_done: int = 0                  # talker warm-up positions run
    frames: int = 0                     # frames run since it went live
    rewound: int = 0                    # frames stepped back by `context_hold`
    forced: deque = field(default_factory=deque)    # function-result tokens still to force
    reset: bool = False                 # state rows to reset before anything else runs

    @property
    def context(self) -> int:           # frames its caches hold (past the prompt and warm-up)
        return self.frames - self.rewound


@dataclass
class _Plan:
    resets: list[int]
    live: list[int]                     # slots that run both frames this beat
    audio: np.ndarray                   # float32 [B, 2, 1280] of `live`
    forced: np.ndarray                  # int64 [B, 2], −1 = none
    session: np.ndarray                 # int64 [B]
    frame0: np.ndarray                  # int64 [B]: index of this beat's first frame
    thinker_need: int                   # positions the live frames reach (thinker, talker)
    talker_need: int
    spent: list[int]                    # live in the clock's eyes but out of context: silence
    rewind: list[int] = field(default_factory=list)                          # step back first
    started: list[int] = field(default_factory=list)      # start work done this beat (live later)
    starts: list["_StartStep"] = field(default_factory=list)                 # run in order


@dataclass
class _StartStep:
    """One bounded chunk of session-start work for up to `starts_per_step` starting slots."""
    prefill: list[tuple[int, list[int], int]] = field(default_factory=list)  # (slot, chunk, start)
    warmup: dict[int, list[tuple[int, int]]] = field(default_factory=dict)   # count → (slot, start)


class CpuBackend(Backend):
    """Subclasses (a GPU backend) reuse the bookkeeping and override the hooks `_build_model`,
    `_alloc_state`, `_compute`, `_frames` and `max_prompt`."""
    name = "cpu"
    max_prompt: int = MAX_PROMPT
    starts_per_step: int = 1 << 30       # starting slots one start step advances
    prefill_chunk: int = PREFILL_CHUNK
    warmup_chunk: int = WARMUP_CHUNK
    start_budget: StartBudget | None = None  # None: start work runs every beat

    def __init__(self, opts: BackendOptions):
        self.opts = opts
        self.max_sessions = opts.max_sessions
        self.max_context = opts.max_context
        if not 0 <= opts.context_hold <= opts.max_context - opts.context_offset:
            raise ValueError(f"context_hold {opts.context_hold} must be within the "
                             f"{opts.max_context - opts.context_offset} frames a session may run")
        self.text_codec = load_text_codec(opts.tokenizer)
        self.user_codec = UserByteFallbackCodec()
        self.cfg, char_table = self._config(opts)
        self.profile = Profile.named(opts.profile)
        torch.set_num_threads(THREADS)
        self.model = self._build_model(opts, char_table)
        self.state = self._alloc_state(opts)
        self._slots = [_Slot() for _ in range(opts.max_sessions)]
        self._sessions = 0
        self._starts = StartQueue()
        self.beat_cpu_s: deque[float] = deque(maxlen=1024)   # worker CPU time of recent beats
        self._executor = ThreadPoolExecutor(1, "wave-cpu", initializer=torch.set_num_threads,
                                            initargs=(THREADS,))

    def _build_model(self, opts: BackendOptions, char_table: CharTable | None) -> VoiceChat:
        self._check_host_memory(opts)
        if opts.checkpoint:
            return load_checkpoint(opts.checkpoint, self.cfg, self.profile, "cpu", char_table)
        return VoiceChat.random(self.cfg, self.profile, "cpu", opts.seed, char_table)

    def _check_host_memory(self, opts: BackendOptions) -> None:
        """Refuse at start, saying why, a model that cannot fit in host memory (the full config
        is ~44 GB of fp32 weights while loading) instead of being killed half-way."""
        weights = 4 * sum(math.prod(s) for s in param_shapes(self.cfg).values())
        state = opts.max_sessions * session_state_bytes(self.cfg, self.profile, opts.max_context,
                                                        self.max_prompt)["total"]
        available = available_host_memory()
        if available is not None and weights + state > available:
            raise MemoryError(
                f"the {self.cfg.name} model needs {weights / 1e9:.1f} GB of host memory for its "
                f"weights (fp32 while loading) + {state / 1e9:.1f} GB of state for "
                f"{opts.max_sessions} sessions; {available / 1e9:.1f} GB are available. "
                f"Use --config tiny, or a GPU backend")

    def _alloc_state(self, opts: BackendOptions):
        return self.model.alloc_state(opts.max_sessions, opts.max_context, self.max_prompt)

    def _config(self, opts: BackendOptions) -> tuple[VoiceChatConfig, CharTable | None]:
        """The model config; with a tokenizer, the talker's character table comes from its pieces
        (M_c = the longest piece), and a tokenizer whose ids overflow the model's vocabulary (a
        real 131k tokenizer with the tiny config) is refused at start."""
        cfg = VoiceChatConfig.named(opts.config)
        if opts.tokenizer is None:
            return cfg, None
        probe = self.text_codec.encode(VOCAB_PROBE)
        if max(probe, default=0) >= cfg.thinker.vocab:
            raise ValueError(f"the tokenizer {opts.tokenizer} gives ids up to {max(probe)} but the "
                             f"{cfg.name} model's vocabulary has {cfg.thinker.vocab}; use --config full")
        pieces = self.text_codec.char_pieces(cfg.thinker.vocab)
        cfg = cfg.with_max_chars(max(1, max(len(p) for p in pieces)))
        return cfg, CharTable.from_pieces(pieces, cfg.talker)

    # -- session lifecycle (event loop thread) -----------------------------------------------------
    def open_slot(self, slot: int, spec: SessionSpec) -> None:
        tools = list(spec.tools or [])
        if len(tools) > MAX_TOOLS:
            log.warning("slot %d: %d tools, the model takes %d; keeping the first %d",
                        slot, len(tools), MAX_TOOLS, MAX_TOOLS)
            tools = tools[:MAX_TOOLS]
        tokens = prompt_tokens(self.text_codec, spec.instructions, tools)
        if max(tokens) >= self.cfg.thinker.vocab:
            log.warning("slot %d: prompt ids outside the vocabulary dropped", slot)
            tokens = [t for t in tokens if t < self.cfg.thinker.vocab]
        if len(tokens) > self.max_prompt:
            log.warning("slot %d: system prompt of %d tokens cut to %d", slot, len(tokens), self.max_prompt)
            tokens = tokens[:self.max_prompt - 1] + [EOS]
        self._sessions += 1
        self._slots[slot] = _Slot("starting", self._sessions, tokens, reset=True)
        self._starts.open(slot)

    def close_slot(self, slot: int) -> None:
        self._slots[slot] = _Slot()
        self._starts.close(slot)

    def ready(self, slot: int) -> bool:
        return self._slots[slot].phase in ("live", "spent")

    def start_refused(self, slot: int) -> str | None:
        return self._starts.refused(slot)

    def push_function_tokens(self, slot: int, ids: list[int]) -> None:
        s = self._slots[slot]
        if s.phase == "closed":
            return
        bad = [i for i in ids if not 0 <= i < self.cfg.thinker.vocab]
        if bad:
            log.warning("slot %d: function tokens %s outside the vocabulary dropped", slot, bad[:5])
        s.forced.extend(i for i in ids if 0 <= i < self.cfg.thinker.vocab)

    # -- the beat ----------------------------------------------------------------------------------
    async def run_beat(self, inp: BeatInput, out: BeatOutput) -> BeatOutput:
        return await self._run_plan(self._plan(inp), out)

    async def _run_plan(self, plan: "_Plan", out: BeatOutput) -> BeatOutput:
        loop = asyncio.get_running_loop()
        out.compute_s = await loop.run_in_executor(self._executor, self._compute, plan, out)
        return out

    def _plan(self, inp: BeatInput) -> _Plan:
        """Host bookkeeping for one beat: advance every slot's counters as if the plan ran."""
        resets = [i for i, s in enumerate(self._slots) if s.reset]
        for i in resets:
            self._slots[i].reset = False
        live, spent, rewind = [], [], []
        hold = self.opts.context_hold
        for i in map(int, np.flatnonzero(inp.live)):
            s = self._slots[i]
            if s.phase == "live" and s.context + FRAMES_PER_BEAT > self.max_context:
                if hold:
                    rewind.append(i)
                    s.rewound += hold
                else:
                    log.warning("slot %d ran out of context (%d frames): silent from now on", i, s.frames)
                    s.phase = "spent"
            if s.phase in ("live", "spent"):
                (live if s.phase == "live" else spent).append(i)
        rows = [self._slots[i] for i in live]
        forced = np.full((len(live), FRAMES_PER_BEAT), -1, np.int64)
        for r, s in enumerate(rows):
            for f in range(min(FRAMES_PER_BEAT, len(s.forced))):
                forced[r, f] = s.forced.popleft()
        plan = _Plan(resets, live, inp.audio[live], forced,                 # (a copy)
                     np.array([s.session for s in rows], np.int64),
                     np.array([s.frames for s in rows], np.int64),
                     max((len(s.prompt) + s.context for s in rows), default=0) + FRAMES_PER_BEAT,
                     max((s.context for s in rows), default=0) + self.cfg.talker.n_warmup + FRAMES_PER_BEAT,
                     spent, rewind)
        for s in rows:
            s.frames += FRAMES_PER_BEAT
        self._plan_start(plan, inp.time_left_s)
        return plan

    def _plan_start(self, plan: _Plan, time_left_s: float) -> None:
        """This beat's start steps (`StartQueue`: as many as the beat's `start_budget` has room
        for, a single step for all without one), each one bounded chunk of prompt and of warm-up
        for up to `starts_per_step` slots; then the finished starts the budget lets go live do
        (from the next beat on)."""
        for group in self._starts.plan(len(plan.live), time_left_s, self.start_budget,
                                       self.starts_per_step):
            plan.starts.append(self._start_step(group, plan))
        for i in self._starts.going_live(len(plan.live), time_left_s, self.start_budget):
            self._slots[i].phase = "live"

    def _start_step(self, slots: list[int], plan: _Plan) -> _StartStep:
        n_warm, step = self.cfg.talker.n_warmup, _StartStep()
        for i in slots:
            s = self._slots[i]
            if s.prompt_done < len(s.prompt):
                chunk = s.prompt[s.prompt_done:s.prompt_done + self.prefill_chunk]
                step.prefill.append((i, chunk, s.prompt_done))
                s.prompt_done += len(chunk)
            if s.warm_done < n_warm:
                count = min(self.warmup_chunk, n_warm - s.warm_done)
                step.warmup.setdefault(count, []).append((i, s.warm_done))
                s.warm_done += count
            if s.prompt_done == len(s.prompt) and s.warm_done == n_warm:
                self._starts.finished(i)
                plan.started.append(i)
        return step

    # -- the worker thread -------------------------------------------------------------------------
    def _compute(self, plan: _Plan, out: BeatOutput) -> float:
        """Run the plan; returns its wall time (and records its CPU time in `beat_cpu_s`)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        with torch.no_grad():
            self._reset_and_rewind(plan)
            if plan.live:
                self._frames(plan, out)
            self._silence_spent(plan, out)
            t1 = t = time.perf_counter()
            for step in plan.starts:
                self._run_start_step(step)
                if self.start_budget is not None:          # each step's cost, for the budget
                    self._sync()
                    self.start_budget.observe_start(time.perf_counter() - t)
                    t = time.perf_counter()
        if self.start_budget is not None and plan.live:
            self.start_budget.observe_live(len(plan.live), t1 - t0)
        self.beat_cpu_s.append(time.thread_time() - c0)
        return time.perf_counter() - t0

    def _run_start_step(self, step: _StartStep) -> None:
        if step.prefill:
            self._prefill(step.prefill)
        for count, rows in step.warmup.items():
            slots = [i for i, _ in rows]
            window = self._window(0, max(start for _, start in rows) + count)
            self.model.warmup_chunk(window, self._index(slots), count)

    @staticmethod
    def _silence_spent(plan: "_Plan", out: BeatOutput) -> None:
        for i in plan.spent:
            out.pcm[i], out.text[i], out.func[i], out.user[i] = 0.0, PAD, PAD, NO_TOKEN

    def _reset_and_rewind(self, plan: "_Plan") -> None:
        """The plan's slot resets (sessions opened) and context-hold rewinds, before its frames."""
        if plan.resets:
            self.state.reset(self._index(plan.resets))
        if plan.rewind:
            self._rewind(self._index(plan.rewind))

    def _rewind(self, slots: torch.Tensor) -> None:
        """`context_hold` positions back (see top): the next frames overwrite rows already there."""
        self.state.thinker.length[slots] -= self.opts.context_hold
        self.state.talker.position[slots] -= self.opts.context_hold

    def _index(self, values) -> torch.Tensor:
        """Host ints → an int64 tensor on the state's device (slots, tokens, counts)."""
        return torch.as_tensor(np.asarray(values, np.int64), device=self.state.text_prev.device)

    def _window(self, thinker_need: int, talker_need: int):
        """The state's KV caches cut to the positions a call writes, rounded up (see top)."""
        cut = lambda need, cap: min(cap, max(1, -(-need // WINDOW_STEP)) * WINDOW_STEP)
        return self.state.window(cut(thinker_need, self.state.thinker.max_positions),
                                 cut(talker_need, self.state.talker.max_positions))

    def _frames(self, plan: _Plan, out: BeatOutput) -> None:
        live, dev = plan.live, self.state.text_prev.device
        slots, session = self._index(live), self._index(plan.session)
        window = self._window(plan.thinker_need, plan.talker_need)
        noise_of = lambda f: self.model.noise(self.opts.seed, session, self._index(plan.frame0 + f))  # noqa: E731

        def emit(f: int, o) -> None:
            out.pcm[live, f] = o.pcm.cpu().numpy()
            out.text[live, f] = o.text.cpu().numpy()
            out.func[live, f] = o.func.cpu().numpy()
            out.user[live, f] = o.user.cpu().numpy()

        self.model.frames(window, torch.from_numpy(plan.audio).to(dev), slots, noise_of,
                          self._index(plan.forced), emit)

    def _sync(self) -> None:
        """Wait for queued device work (a GPU backend), so a measured time is the work's."""

    def _prefill(self, rows: list[tuple[int, list[int], int]]) -> None:
        tokens = np.full((len(rows), self.prefill_chunk), PAD, np.int64)
        for r, (_, chunk, _) in enumerate(rows):
            tokens[r, :len(chunk)] = chunk
        need = max(start + len(chunk) for _, chunk, start in rows)
        window = self._window(need, 0)
        self.model.prefill_chunk(window, self._index([i for i, _, _ in rows]), self._index(tokens),
                                 self._index([len(chunk) for _, chunk, _ in rows]))

    # -- facts -------------------------------------------------------------------------------------
    def describe(self) -> dict:
        state = session_state_bytes(self.cfg, self.profile, self.max_context, self.max_prompt)["total"]
        return {"backend": self.name, "max_sessions": self.max_sessions, "config": self.cfg.name,
                "profile": self.profile.name, "parameters": self.model.parameter_count(),
                "weights": self.opts.checkpoint or f"random (seed {self.opts.seed})",
                "text_codec": getattr(self.text_codec, "name", type(self.text_codec).__name__),
                "max_context_frames": self.max_context, "max_prompt_tokens": self.max_prompt,
                "state_bytes_per_session": state}

    def close(self) -> None:
        self._executor.shutdown(wait=True)
