"""`beat_time(n_sessions, context_frames)`: how long one beat takes, from the roofline.

A beat is two frames; each frame reads every weight once for the whole batch and each session's
state once (docs/MODEL.md §5): mem = 2·(W + N·S(L))/BW, comp = 2·N·(bf16/R_bf16 + tf32/R_tf32), and
the beat takes max(mem, comp) plus a fixed overhead. Parameters load from JSON so that fitted
GPU measurements can replace the roofline defaults. A beat's other work adds its own: start
rows, slot resets, context rolls, prompt-snapshot copies and saves (`draw_parts`).

A measured model (`sim.fit`) holds instead the executor's beat measured at some batch sizes
(`beat_points`), interpolated between them. A beat of n live sessions costs the beat of the
batch the engine replays for it: the graph executor captures a ladder of buckets up to its
slots (`wave_actors/core/sched/buckets.py`) and pads a beat to the smallest that holds it, so with
`slots` known a beat is priced at `bucket_for(n, slots)` (without: at n; the roofline prices
the live rows alone); `buckets`, where given, are the buckets a device captured (one short of
memory stops its ladder early, and an engine before the ladder captured only the top:
`sim.validate` replays a GPU run's own). Below the smallest point the stages' shape (else the
roofline's) carries the smallest down; above the largest the measured stages' growth
(`sim/stages.py`) or else the last slope (or the roofline's) carries on. Its jitter is the
measured beats' relative residuals, and the host's time outside the executor (frames read and packed,
outputs routed: what virtual time does not take) is a measured sample; both are resampled with
the executor's seeded rng, so a seed gives the same beats.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from wave_actors.core.sched.buckets import bucket_for
from wave_actors.core.sched.start_shape import GRAPH_MAX_PROMPT

DEFAULT_PATH = Path(__file__).with_name("costmodel.json")

# Prompt snapshots (wave_actors/core/sched/snapshots.py): what one holds in the full model, the same in
# both profiles (fp32 SSM states, bf16 conv states and KV rows in each). Computed from the real
# shapes on the meta device (sim stays torch-free, so not imported here):
#   .venv/bin/python -c "from gpu.model.config import VoiceChatConfig, PROFILES;
#   from gpu.model.voicechat_state import VoiceChatState;
#   from gpu.engine.snapshot_rows import space_for;
#   st = VoiceChatState.alloc(VoiceChatConfig.full(), PROFILES['dense'], 1, 16, 'meta',
#                             max_prompt=512);
#   s = space_for(st, 1e9, ''); print(s.fixed_bytes, s.bytes_per_position)"
# (the same with PROFILES['reference']).
# fixed: SSM 141,557,760 + conv 1,990,656 bytes of one slot; a position: one K and one V row of
# every attention layer.
SNAPSHOT_FIXED_BYTES = 143_548_416
SNAPSHOT_BYTES_PER_POSITION = 16_384
# The graph executor's default (gpu/engine/memory_plan.py SNAPSHOT_BYTES, with
# ExecutorOptions.snapshot_mb = -1): three snapshots of the full model's 512 prompt positions.
SNAPSHOT_BYTES = 0.5e9
# Until an H200 fit prices them: a snapshot copy (or save) moves a whole prompt's snapshot
# (GRAPH_MAX_PROMPT = 512 positions: 151,937,024 bytes) once each way, read and write, at a
# conservative 3.0e12 B/s device copy rate: 2 × 151,937,024 / 3.0e12 = 101.3 µs.
COPY_BPS = 3.0e12
SNAPSHOT_COPY_S = round(2 * (SNAPSHOT_FIXED_BYTES
                             + GRAPH_MAX_PROMPT * SNAPSHOT_BYTES_PER_POSITION) / COPY_BPS, 9)


@dataclass(frozen=True)
class CostModel:
    bandwidth_Bps: float
    bf16_flops: float
    tf32_flops: float
    weight_bytes_per_frame: float
    fixed_bytes: float
    bytes_per_context_frame: float
    bf16_flops_per_frame: float
    tf32_flops_per_frame: float
    overhead_s_per_beat: float = 0.0
    start_rows_s: float = 0.0             # what a beat's start rows add to it
    small_rows_s: float | None = None     # the same for the small row capture (None: as above)
    # What a beat's other work beside its live rows adds (`sim.fit`, from beats that carried
    # it): each slot reset for a session opened, and each session whose context rolls after it
    # (its cache rows moved), more in a beat that also carries start rows (measured so: the
    # rows' work does not overlap the moves). The roofline has none of them.
    reset_s: float = 0.0
    roll_s: float = 0.0
    row_roll_s: float = 0.0
    # What the first beat that rolls a context adds, once in an executor's life, where it
    # carries no start rows: the graph executor runs rolls eagerly, outside its captured
    # graphs, and their first use loads kernels and builds the RoPE turn tables on the host
    # (beside start rows' work it hides within their spread; the wpk executor warms the roll
    # before serving, and its runs show no such beat). A policy that reads a single slow beat
    # without rows (`headroom`) sees it.
    first_roll_s: float = 0.0
    # What a beat adds per prompt-snapshot copy (a start from a snapshot: `BookPlan.copies`,
    # after the resets) and per save (a prompt's start state kept: `BookPlan.saves`, after the
    # rows), and once where it copies at all (`copy_beat_s`: the H200's beats at 300 slots grew
    # ~6 ms with their first copy, ~0.5 ms with each more); `sim.fit` fits copy_s and
    # copy_beat_s where the traces count copies, else copy_s and save_s are the prior above.
    copy_s: float = SNAPSHOT_COPY_S
    save_s: float = SNAPSHOT_COPY_S
    copy_beat_s: float = 0.0
    # A snapshot of p prompt positions holds snapshot_fixed_bytes + p × snapshot_bytes_per_position
    # (the sim executor's `snapshot_space`, as the GPU executor's `space_for`).
    snapshot_fixed_bytes: float = SNAPSHOT_FIXED_BYTES
    snapshot_bytes_per_position: float = SNAPSHOT_BYTES_PER_POSITION
    jitter_rel: float = 0.0
    # By this share of a beat's time its frame 0 is done and routed (frame 1 computes on): the
    # engine's beat hears both frames, then thinks, speaks and decodes frame 0 before frame 1.
    # The profiles' values are measured (costmodel.json's `_first_frame_share`).
    first_frame_share: float = 0.72
    usable_bytes: float = 148e9           # device memory the engine may use
    weights_bytes: float = 23.83e9
    workspace_bytes: float = 4e9
    state_fixed_bytes: float = 166_694_864      # per-session state held (docs/MODEL.md §3)
    state_bytes_per_frame: float = 532_480
    # Measured (`sim.fit`): ((batch size, executor seconds), ...) ascending, over the contexts
    # `points_context` (lo, hi) the measured beats held; a context outside shifts by the
    # roofline's difference from the nearer end (inside, the residuals hold the variation).
    # Empty: the roofline.
    beat_points: tuple = ()
    points_context: tuple = (0.0, float("inf"))
    residuals: tuple = ()        # measured beat / its point - 1: resampled as the jitter
    row_residuals: tuple = ()    # the same of beats with start rows (empty: `residuals`)
    host_s: tuple = ()           # measured release → outputs routed, less the executor's time
    # Per-stage shape (`sim/stages.py`): {stage: (fixed s, s a session)} a beat. Past the
    # largest measured batch the beat grows as their sum does; `stage_speedup` {stage: factor}
    # divides a stage's share of every beat (a what-if). Empty: neither.
    stages: dict = field(default_factory=dict)
    stage_speedup: dict = field(default_factory=dict)
    # The buckets the engine captured (ascending; a beat replays the smallest that holds it,
    # the slots past the largest); empty: every bucket of the ladder up to the slots.
    buckets: tuple = ()

    @classmethod
    def load(cls, path: str | Path | None = None, profile: str = "reference") -> "CostModel":
        return cls.from_doc(json.loads(Path(path or DEFAULT_PATH).read_text()), profile)

    @classmethod
    def from_doc(cls, raw: dict, profile: str) -> "CostModel":
        """A cost-model JSON document (as `load` reads, or `sim.fit` builds) for one profile."""
        if profile not in raw["profiles"]:
            raise ValueError(f"cost model has no profile {profile!r}: {sorted(raw['profiles'])}")
        params = {k: v for k, v in raw.items() if not k.startswith("_") and k != "profiles"}
        params.update(raw["profiles"][profile])
        for key in ("beat_points", "points_context", "residuals", "row_residuals",
                    "host_s", "buckets"):                               # lists → tuples
            if key in params:
                params[key] = tuple(tuple(v) if isinstance(v, list) else v
                                    for v in params[key])
        return cls(**params)

    def session_bytes(self, context_frames: float) -> float:
        return self.fixed_bytes + context_frames * self.bytes_per_context_frame

    def state_bytes(self, context_frames: float) -> float:
        return self.state_fixed_bytes + context_frames * self.state_bytes_per_frame

    def capacity(self, context_frames: float) -> int:
        """Sessions whose state fits beside the weights and workspace (docs/MODEL.md §4)."""
        free = self.usable_bytes - self.weights_bytes - self.workspace_bytes
        return max(0, int(free // self.state_bytes(context_frames)))

    def batch(self, n_sessions: int, slots: int | None = None) -> int:
        """The batch the engine replays for a beat of `n_sessions` live sessions on a node of
        `slots` slots: its ladder's bucket (`bucket_for`), or the smallest of the `buckets` it
        captured that holds them; without `slots`, n itself."""
        if not slots:
            return n_sessions
        n = max(1, n_sessions)
        if self.buckets:
            return min([b for b in self.buckets if n <= b <= slots] + [slots])
        return bucket_for(n, slots)

    def beat_time(self, n_sessions: int, context_frames: float,
                  slots: int | None = None) -> float:
        """The executor's beat without jitter or start rows: measured where the model has
        points, at the bucket the engine replays (`batch`); else the roofline's, of the live
        rows alone (a per-session cost, as the tests' models build on it)."""
        if self.beat_points:
            b, (lo, hi) = max(1, self.batch(n_sessions, slots)), self.points_context
            shift = (self.roofline_time(b, context_frames)
                     - self.roofline_time(b, min(max(context_frames, lo), hi)))
            return (self._measured(b) + shift) * self._speedup(b)
        return (self.roofline_time(n_sessions, context_frames)
                * self._speedup(max(1, n_sessions)))

    def stage_time(self, n: int, speedup: bool = False) -> float:
        """The stages' beat at batch n (their lines' sum), each divided by its speedup."""
        sp = self.stage_speedup if speedup else {}
        return sum((a + b * n) / sp.get(name, 1.0) for name, (a, b) in self.stages.items())

    def _speedup(self, b: int) -> float:
        """The share of a beat left when stages run `stage_speedup` times faster (1: none);
        `b`: the batch the GPU replays."""
        if not (self.stages and self.stage_speedup):
            return 1.0
        return self.stage_time(b, speedup=True) / self.stage_time(b)

    def _measured(self, n: int) -> float:
        pts = self.beat_points
        if n <= pts[0][0]:
            n_lo, t_lo = pts[0]
            if n == n_lo:
                return t_lo
            if self.stages:              # as the measured stages shrink
                return t_lo * self.stage_time(n) / self.stage_time(n_lo)
            lo = self.points_context[0]
            return max(0.0, t_lo + self.roofline_time(n, lo) - self.roofline_time(n_lo, lo))
        for (n0, t0), (n1, t1) in zip(pts, pts[1:]):
            if n <= n1:
                return t0 + (t1 - t0) * (n - n0) / (n1 - n0)
        n_top, t_top = pts[-1]
        if self.stages:                  # as the measured stages grow
            return t_top * self.stage_time(n) / self.stage_time(n_top)
        if len(pts) > 1:
            n0, t0 = pts[-2]
            return t_top + (t_top - t0) * (n - n_top) / (n_top - n0)
        return t_top + (self.roofline_time(n, self.points_context[0])
                        - self.roofline_time(n_top, self.points_context[0]))

    def roofline_time(self, n_sessions: int, context_frames: float) -> float:
        if n_sessions <= 0:
            return self.overhead_s_per_beat
        mem = 2 * (self.weight_bytes_per_frame + n_sessions * self.session_bytes(context_frames))
        mem /= self.bandwidth_Bps
        comp = 2 * n_sessions * (self.bf16_flops_per_frame / self.bf16_flops
                                 + self.tf32_flops_per_frame / self.tf32_flops)
        return max(mem, comp) + self.overhead_s_per_beat

    def rows_time(self, rows: int, capture: int, full_capture: int) -> float:
        """What `rows` start rows add to a beat, by the row capture the GPU replays for them
        (`capture` of the executor's `full_capture` rows): the small capture's cost when it
        holds them and the model has one."""
        if not rows:
            return 0.0
        if self.small_rows_s is not None and capture < full_capture:
            return self.small_rows_s
        return self.start_rows_s

    def draw_beat(self, n_live: int, context: float, rows: int, capture: int,
                  full_capture: int, rng: random.Random, resets: int = 0,
                  rolls: int = 0, first_roll: bool = False, copies: int = 0,
                  saves: int = 0, slots: int | None = None) -> float:
        """One beat's modelled seconds, release to outputs routed: the live rows' time with its
        jitter, plus the start rows', plus the host's time outside the executor. The sim
        executor and the fast mode both draw from here, so for one seed they draw the same
        beats. `first_roll`: no earlier beat of this executor rolled a context; `copies`,
        `saves`: the beat's prompt-snapshot copies and saves; `slots`: the node's (the beat is
        priced at its bucket, `batch`)."""
        executor_s, host_s = self.draw_parts(n_live, context, rows, capture, full_capture, rng,
                                             resets, rolls, first_roll, copies, saves, slots)
        return executor_s + host_s

    def draw_parts(self, n_live: int, context: float, rows: int, capture: int,
                   full_capture: int, rng: random.Random, resets: int = 0,
                   rolls: int = 0, first_roll: bool = False, copies: int = 0,
                   saves: int = 0, slots: int | None = None) -> tuple[float, float]:
        """`draw_beat`'s two parts: (the executor's seconds, the host's seconds around it).
        Virtual time gives the host's work no time, so a measured model adds it here. The
        jitter scales the whole executor's beat (a fitted model's residuals are measured
        against the whole)."""
        live_s = (self.beat_time(n_live, context, slots)
                  + self.rows_time(rows, capture, full_capture)
                  + resets * self.reset_s + copies * self.copy_s + saves * self.save_s
                  + (self.copy_beat_s if copies else 0.0)
                  + rolls * (self.roll_s + (self.row_roll_s if rows else 0.0))
                  + (self.first_roll_s if rolls and first_roll and not rows else 0.0))
        pool = self.row_residuals if rows and self.row_residuals else self.residuals
        if pool:
            live_s *= max(0.0, 1.0 + pool[rng.randrange(len(pool))])
        elif self.jitter_rel:
            live_s *= max(0.0, 1.0 + self.jitter_rel * rng.gauss(0.0, 1.0))
        host = self.host_s[rng.randrange(len(self.host_s))] if self.host_s else 0.0
        return live_s, host
