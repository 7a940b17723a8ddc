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

How a beat is launched and waited for: `graph/beat_runner.py`.
"""
from __future__ import annotations

import dataclasses
import logging
import time

import torch

from gpu.engine.baseline import measure_baseline
from gpu.engine.decode_ops import TritonDecodeOps, install
from gpu.engine.graph.beat_graphs import BeatGraphs, beat_budget_s
from gpu.engine.graph.beat_runner import BeatRunner
from gpu.engine.graph.first_frame import poll_until
from gpu.engine.graph.host_rings import PinnedRings
from gpu.engine.memory_plan import (LADDER_BYTES, SNAPSHOT_BYTES, MemoryPlan, device_free,
                                    memory_ceiling)
from gpu.engine.model_runner import ModelRunner, model_config, text_codecs
from gpu.model.checkpoint import load_checkpoint
from gpu.model.config import Profile
from gpu.model.voicechat import VoiceChat
from gpu.model.voicechat_weights import load_dtype, random_weights_on
from wave_actors.core.sched.buckets import BUCKETS, bucket_for
from wave_actors.core.contract import BeatInput, BeatOutput, ExecutorOptions, SessionSpec
from wave_actors.core.registry import REGISTRY
from wave_actors.core.sched.slot_book import BookPlan
from wave_actors.core.sched.start_shape import StartShape
from wave_actors.core.sched.spread import spread_ms
from wave_actors.core.timebase import Clock

log = logging.getLogger("wave.graph_executor")


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
        options, ceiling = self._state_rows(options, snapshot_bytes)
        self.options, self.capture = options, capture
        self.max_sessions = options.max_sessions
        self.plan_memory = MemoryPlan(self.cfg, self.profile, options.max_sessions,
                                      options.max_context, self.start_shape.max_prompt,
                                      snapshot_bytes)
        self.plan_memory.check(device_free(options.gpu_share))
        torch.backends.cuda.matmul.allow_tf32 = self.profile.tf32
        torch.backends.cudnn.allow_tf32 = self.profile.tf32
        self.runner = ModelRunner(self._build_model(char_table), options, self.start_shape,
                                  options.max_sessions + 1, snapshot_bytes)
        self.snapshot_space = self.runner.snapshots.space
        self.graphs = BeatGraphs(self.runner, options, self.start_shape, self.device,
                                 capture, streams)
        self.first = self.graphs.first
        self.beats = BeatRunner(options.beat_wait == "poll", self._graph_of)
        # The largest bucket is captured now, with and without start rows, so no beat ever
        # waits for a capture; smaller ones (less padding) are captured between beats by
        # `prepare`.
        with torch.no_grad():       # the warm-up rows every reset copies: run once, now
            self.model.warm_template(self.state.talker)
        self.slots = self.graphs.size_slots(self.max_sessions, ceiling) if sizing else {
            "sessions": self.max_sessions, "decided_by": "max_sessions (set by the caller)",
            "memory_ceiling": ceiling,
            "budget_ms": round(1e3 * beat_budget_s(options.gpu_share), 1),
            "beat_ms_at_context": {}}
        self.max_sessions = self.graphs.max_sessions = self.slots["sessions"]
        self.rings = PinnedRings(self.max_sessions)
        top = bucket_for(self.max_sessions, self.max_sessions)
        self.graphs.warm_eager()
        self.graphs.capture_ladder(top)
        self._measure_starts(top, timed_top=not sizing)
        log.info("slots: %d (%s); memory holds %d; beat at full context: %s ms "
                 "(budget %.0f ms)", self.max_sessions, self.slots["decided_by"], ceiling,
                 self.slots["beat_ms_at_context"], self.slots["budget_ms"])

    def _measure_starts(self, top: int, timed_top: bool) -> None:
        """What each row capture adds to a beat, and beats at full context (s), for a start
        policy that budgets start work by them until it has measured its own (`timed_top`:
        the top bucket's beat is timed here; a sizing timed it already)."""
        self.start_rows_cost = self.graphs.time_start_rows(top)
        self.start_row_s = {c: ms / 1e3 for c, ms in
                            self.start_rows_cost["added_ms_by_rows"].items()}
        at_context = self.slots["beat_ms_at_context"]
        if timed_top:
            at_context[top] = round(1e3 * self.graphs.beat_at_context(top), 2)
        self.beat_at_context_s = ({1: self.graphs.beat_at_context(1)}
                                  if (1, 0) in self.graphs.captured else {}) | {
            int(n): ms / 1e3 for n, ms in at_context.items()}

    def _state_rows(self, options: ExecutorOptions, snapshot_bytes: float
                    ) -> tuple[ExecutorOptions, int]:
        """(options with the slots to allocate state for, the memory ceiling in sessions). A
        node that sizes itself (max_sessions 0) gets state for every slot memory holds (its
        measured beat then picks how many serve), at most the largest bucket: past it the
        host, not the device, is what runs out."""
        sizing = options.max_sessions == 0
        ceiling = MemoryPlan(self.cfg, self.profile, 1, options.max_context,
                             self.start_shape.max_prompt, snapshot_bytes
                             ).ceiling(device_free(options.gpu_share)
                                       - (LADDER_BYTES if sizing else 0))
        if not sizing:
            return options, ceiling
        if ceiling < 1:
            raise MemoryError(f"not one session at {options.max_context} frames of context "
                              "fits in the device's free memory")
        return dataclasses.replace(options, max_sessions=min(ceiling, BUCKETS[-1])), ceiling

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

    def _graph_of(self, plan: BookPlan) -> tuple[int, int]:
        g = self.graphs.graph_for(len(plan.live), len(plan.rows))
        return g.bucket, g.start_rows

    @property
    def on_launched(self):
        return self.beats.on_launched

    @on_launched.setter
    def on_launched(self, fn) -> None:
        self.beats.on_launched = fn

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
    def alloc_input(self) -> BeatInput:
        return self.rings.alloc_input()

    def alloc_output(self, into: BeatOutput | None = None) -> BeatOutput:
        return self.rings.alloc_output(into)

    # -- the beat --------------------------------------------------------------------------------
    def submit(self, plan: BookPlan, inp: BeatInput, out: BeatOutput) -> None:
        t0 = time.perf_counter()
        self.first.expect(plan, out)
        self.beats.submit(self._launch, plan, inp, out, t0)

    async def wait_first(self) -> None:
        """Frame 0's rows into `out` once the beat has written them (`FirstFrame`), while
        frame 1 computes."""
        if self.beats.inflight is None:
            return
        _job, t0, plan = self.beats.inflight
        key = (bucket_for(len(plan.live), self.max_sessions), len(plan.rows))
        await self.first.wait(t0, key, self.beats.ended)

    async def wait(self) -> None:
        await self.beats.wait(self.device_done)

    def collect(self, plan: BookPlan, out: BeatOutput) -> float:
        return self.beats.collect()

    def _launch(self, plan: BookPlan, inp: BeatInput, out: BeatOutput) -> bool:
        """Worker thread: the beat's device work enqueued (resets, the replay, the copies), its
        end marked by the runner's `done` event; with beat_wait "thread", waited for here.
        Returns whether it waited."""
        t0, beats = time.perf_counter(), self.beats
        beats.start.record()
        with torch.no_grad():
            beats.timed("reset", len(plan.resets), self.runner.reset_slots, plan)
            beats.timed("copy", len(plan.copies), self.runner.snapshots.copy_in, plan.copies)
            if plan.live or plan.rows:
                self._enqueue(plan, inp, out)
            if plan.started and self.options.context_offset:
                self.prefill_context(plan.started)
        beats.done.record()
        with torch.no_grad():
            self.runner.save(plan)              # behind the rows that made them
            # behind the beat's work: outputs do not wait for them, the next beat does
            beats.timed("roll", len(plan.roll), self.runner.roll, plan, behind=True)
            beats.timed("clean", len(plan.cleans), self.runner.clean, plan, behind=True)
        return beats.launched(t0)

    async def device_done(self, t0: float, fastest: float | None) -> None:
        """Return once the beat's `done` event has passed (`poll_until`: asleep for most of
        the beat)."""
        await poll_until(self.beats.done.query, t0, fastest)

    def _enqueue(self, plan: BookPlan, inp: BeatInput, out: BeatOutput) -> None:
        """The ring's audio rows up to the highest live slot to the device, the rows' slots and
        per-row values into the bucket's buffers, the replay, the output rows back into the
        output ring: all queued on the device, nothing waited for."""
        hi = max(plan.live, default=-1) + 1
        g = self.graphs.rows_in(plan)
        if hi:
            self.graphs.d_audio[:hi].copy_(self.rings.tensor(inp.audio)[:hi], non_blocking=True)
        self.graphs.replay(g)
        if hi:
            self.rings.outputs_from(self.graphs.d_out, out, hi)

    def prefill_context(self, slots: list[int]) -> None:
        """Model a session that already spoke for `context_offset` frames: its caches hold that
        many positions. The rows stay as the reset left them: the work of a frame depends only
        on the lengths, and filling them would need gigabytes of temporaries a beat on a device
        planned to its memory ceiling. Queued behind the beat that finished its prompt, a view
        a slot: an index tensor made from a host list is a copy from pageable memory, which
        waits for the whole replay before the launch can go on to queue the rolls behind it."""
        n = self.options.context_offset
        for slot in slots:
            self.state.thinker.length[slot].add_(n)
            self.state.talker.position[slot].add_(n)

    def prepare(self, sessions: int, optional: bool = False) -> bool:
        """Capture the beat graphs `sessions` live sessions use (`BeatGraphs.prepare`), between
        beats."""
        return self.graphs.prepare(sessions, optional)

    def describe(self) -> dict:
        free, total = torch.cuda.mem_get_info()
        return self.runner.facts(self.name, self.text_codec, self.profile) | {
                "gpu": torch.cuda.get_device_name(0),
                "weights_bytes": self.plan_memory.weights,
                "state_bytes_per_session": self.plan_memory.per_session,
                "memory_used_bytes": total - free,
                "memory_total_bytes": total,
                "memory_ceiling_sessions": self.plan_memory.ceiling(self.options.gpu_share
                                                                    * total),
                "max_sessions": self.max_sessions, "slots": self.slots,
                **self.beats.facts(), "first_poll_ms": self.first.poll_s * 1e3,
                "buckets_captured": self.graphs.buckets(), "ladder": self.graphs.ladder,
                "start_rows": self.start_rows_cost,
                "snapshots": self.snapshot_facts()}

    def snapshot_facts(self) -> dict:
        """The snapshot rows' memory and what a copy-start cost the beats it rode in: the
        device time of the beat's copies, per copy (its slot's reset, as every start's, apart)."""
        def per(name: str) -> dict:
            beats = self.beats.start_ms[name]
            return {"beats": len(beats), "sessions": sum(n for _, n in beats),
                    "ms_per_session": spread_ms([ms / n / 1e3 for ms, n in beats])
                    if beats else {}}
        return {"device_bytes": self.runner.snapshots.nbytes(),
                "entries": self.snapshot_space.entries,
                **{name: per(name) for name in ("copy", "reset", "roll", "clean")}}

    def close(self) -> None:
        self.beats.close()
        torch.cuda.synchronize()
        self.rings.close()
