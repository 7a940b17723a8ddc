"""The graph executor's beats as CUDA graphs: one per batch-size bucket and start-row capture,
their static device inputs, the beat body they capture, and the device-time probes that size a
node and price its start rows.

A beat gathers its bucket's audio rows by slot, runs two frames, and scatters the outputs by
slot; padded rows read and write the trash slot (the last state row). The graphs share one
memory pool, with the eager warm-up before each capture: the warm-up's blocks are the ones its
capture then takes, and a smaller bucket's capture reuses what a larger one freed (outside the
pool, a warm-up needs memory of its own, which a node filled to its memory ceiling does not
have).
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np
import torch

from gpu.engine.graph.beat_streams import StreamedBeat
from gpu.engine.graph.first_frame import FirstFrame
from gpu.engine.graph.host_rings import OUTPUTS
from gpu.engine.memory_plan import GRAPH_FIXED_BYTES, LADDER_KEEP_FREE, planned_memory
from gpu.engine.model_runner import ModelRunner
from wave_actors.core.contract import MAX_USER_TOKENS, NO_TOKEN, ExecutorOptions
from wave_actors.core.frames import BEAT_S, FRAMES_PER_BEAT, SAMPLES_IN, SAMPLES_OUT
from wave_actors.core.sched.buckets import BUCKETS, bucket_for
from wave_actors.core.sched.slot_book import BookPlan
from wave_actors.core.sched.start_shape import StartShape

log = logging.getLogger("wave.graph_executor")

SMALL_FIRST = 16              # buckets up to this many rows are captured right after the top
# A node sized by the executor (max_sessions 0) takes the most sessions whose beat, every cache
# at its full context, the device runs in this share of a beat: the rest is the host's (packing,
# routing: p99 under 3 ms at dense 300), the rolls', and what the start policy lets start rows
# and snapshot copies take where a beat has room.
ON_TIME_SHARE = 0.88


def beat_budget_s(gpu_share: float = 1.0) -> float:
    """The device time a node's beat may take at full context: ON_TIME_SHARE of a beat, of its
    share of the GPU where nodes share one (they take turns on it)."""
    return ON_TIME_SHARE * BEAT_S * gpu_share


class Captured:
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


class BeatGraphs:
    def __init__(self, runner: ModelRunner, options: ExecutorOptions, start_shape: StartShape,
                 device: torch.device, capture: bool = True, streams: bool = True):
        """capture=False runs the same beat body eagerly instead of replaying its graph, and
        streams=False runs a beat's stages in order on one stream."""
        self.runner, self.options, self.start_shape = runner, options, start_shape
        self.device, self.capture = device, capture
        self.max_sessions = options.max_sessions      # the executor's, once it has sized itself
        self.trash = options.max_sessions
        s, dev = options.max_sessions + 1, device
        self.d_audio = torch.zeros(s, FRAMES_PER_BEAT, SAMPLES_IN, device=dev)   # row S: zeros
        self.d_out = {"pcm": torch.zeros(s, FRAMES_PER_BEAT, SAMPLES_OUT, device=dev),
                      "text": torch.zeros(s, FRAMES_PER_BEAT, dtype=torch.int32, device=dev),
                      "func": torch.zeros(s, FRAMES_PER_BEAT, dtype=torch.int32, device=dev),
                      "user": torch.full((s, FRAMES_PER_BEAT, MAX_USER_TOKENS), NO_TOKEN,
                                         dtype=torch.int32, device=dev)}
        assert set(self.d_out) == set(OUTPUTS)
        self.first = FirstFrame(self.d_out, dev, options.first_poll_ms / 1e3)
        self.captured: dict[tuple[int, int], Captured] = {}   # (bucket, start rows it holds)
        # the ladder's decision a bucket below the top: the free memory it met, what its
        # graphs took, or why it was skipped ("estimate": priced past the free memory;
        # "memory": its warm-up ran out)
        self.ladder: dict[int, dict] = {}
        self._mempool = torch.cuda.MemPool()
        self.pool = self._mempool.id
        # Every warm-up and capture on one stream: the caching allocator hands a freed block
        # only to work on the stream that freed it, so a warm-up on a stream of its own would
        # leave its peak in the pool for nothing after it to reuse. Without beat graphs too:
        # the reset and copy graphs are captured all the same.
        self._side = torch.cuda.Stream(device)
        self.streamed = StreamedBeat(self.model, device) if streams else None
        # The thinker positions a start row may reach (a prompt chunk past the prompt's last
        # position), rounded up: the start rows' attention runs on this window of the caches.
        chunk = start_shape.prefill_chunk
        self._prompt_window = min(-(-(start_shape.max_prompt + chunk) // 64) * 64,
                                  self.state.thinker.max_positions)

    @property
    def model(self):
        return self.runner.model

    @property
    def state(self):
        return self.runner.state

    def buckets(self) -> list[int]:
        return sorted({b for b, _ in self.captured})

    # -- the beat ------------------------------------------------------------------------------
    def graph_for(self, n: int, rows: int) -> Captured:
        """The smallest captured bucket that holds n sessions, with the smallest row capture
        that holds `rows` start rows (extra rows are padding)."""
        cap = self.start_shape.capture_for(rows)
        return self.captured[min(b for b, r in self.captured if b >= n and r == cap), cap]

    def rows_in(self, plan: BookPlan) -> Captured:
        """The plan's rows into its capture's inputs, queued to the device: the live slots
        (padded rows point at the trash slot) with their per-row values, and the start rows'
        prompt chunks."""
        g = self.graph_for(len(plan.live), len(plan.rows))
        n, h = len(plan.live), g.h_in
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
        for k, t in g.d_in.items():
            t.copy_(h[k], non_blocking=True)
        return g

    def replay(self, g: Captured) -> None:
        if g.graph is not None:
            g.graph.replay()
        else:
            with torch.no_grad():
                self.body(g)

    def body(self, g: Captured) -> None:
        """What one replay does: gather the bucket's audio rows by slot, two frames, scatter the
        outputs by slot (padded rows read and write the trash row). The trash slot's counters
        restart each beat so padded rows never run off its caches. cuDNN stays on for the
        convolutions (perception, codec); the RNNT turns it off for its LSTM. With `streams` the
        frames' independent stages overlap (beat_streams.py); without, they run in order on one
        stream (the same kernels: outputs equal bit for bit)."""
        st, d, t = self.state, g.d_in, self.trash
        st.thinker.length[t:t + 1].fill_(0)            # slices: a graph captures no host copy
        st.talker.position[t:t + 1].fill_(self.model.cfg.talker.n_warmup)
        torch.index_select(self.d_audio, 0, d["slots"], out=g.audio)
        noise_of = lambda f: self.model.noise(self.options.seed, d["session"], d["frame0"] + f)  # noqa: E731

        def emit(f: int, o) -> None:
            for name in OUTPUTS:
                dst = self.d_out[name][:, f]
                dst.index_copy_(0, d["slots"], getattr(o, name).to(dst.dtype))
            if f == 0:
                self.first.copy_out()

        if self.streamed is not None:
            self.streamed.run(st, g.audio, d["slots"], noise_of, d["forced"], emit)
        else:
            self.model.frames(st, g.audio, d["slots"], noise_of, d["forced"], emit)
        if g.start_rows:
            # the starting slots' next prompt chunks: they share no slot with the live rows
            # (padded rows write the trash slot, which nothing reads)
            window = st.window(self._prompt_window, st.talker.max_positions)
            self.model.prefill_chunk(window, d["row_slots"], d["row_tokens"], d["row_valid"])
        self.first.join()

    # -- captures ------------------------------------------------------------------------------
    def prepare(self, sessions: int, optional: bool = False) -> bool:
        """Capture the bucket that `sessions` live sessions use, with each row capture
        (outside any beat); `optional`: False when memory ran out first (the bucket's graphs
        made so far are dropped: a beat then uses a larger bucket)."""
        b = bucket_for(sessions, self.max_sessions)
        for rows in self.start_shape.row_captures:
            if (b, rows) not in self.captured and self._capture(b, rows, optional) is None:
                for r in self.start_shape.row_captures:
                    self.captured.pop((b, r), None)
                return False
        return True

    def _capture(self, bucket: int, rows: int, optional: bool = False) -> Captured | None:
        """The bucket's beat graph with `rows` start rows. `optional`: one of the ladder below
        the top, given up (None) when its warm-up finds no memory."""
        t0 = time.perf_counter()
        g = Captured(bucket, self.device, rows, self.start_shape.prefill_chunk)
        g.d_in["slots"].fill_(self.trash)
        g.d_in["forced"].fill_(-1)
        if rows:
            g.d_in["row_slots"].fill_(self.trash)
        if not self.capture:                         # eager mode: the buffers, no graph
            self.captured[bucket, rows] = g
            return g
        side = self._side
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.use_mem_pool(self._mempool), torch.cuda.stream(side), \
                    torch.no_grad():
                for _ in range(2):                   # JIT-compile kernels, pick BLAS algorithms
                    self.body(g)
        except torch.OutOfMemoryError:
            if not optional:
                raise
            torch.cuda.synchronize()
            return None                              # before the capture: nothing half-made
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g.graph, pool=self.pool, stream=side), torch.no_grad():
            self.body(g)
        self.captured[bucket, rows] = g
        log.info("captured the beat graph for %d sessions%s in %.1f s (%.2f GB free, %.2f GB "
                 "reserved)", bucket, f" with {g.start_rows} start rows" if rows else "",
                 time.perf_counter() - t0, torch.cuda.mem_get_info()[0] / 1e9,
                 torch.cuda.memory_reserved() / 1e9)
        return g

    def capture_ladder(self, top: int) -> None:
        """Every bucket up to the top, so a beat replays the smallest that holds its rows (a
        lone caller's beat is a one-row beat). The top first: a smaller capture fits in the
        blocks a larger one freed. Then the small buckets, which take little beyond their
        graphs' fixed part and save the most (a beat of a few calls, the first beats of a
        fill), then the rest largest first, while memory lasts."""
        t0 = time.perf_counter()
        wanted = [top] + [b for b in BUCKETS if b <= SMALL_FIRST and b < top] + [
            b for b in reversed(BUCKETS) if SMALL_FIRST < b < top]
        for key in [k for k in self.captured if k[0] not in wanted]:
            del self.captured[key]                                # the sizing's probes
        self.prepare(top)
        self.ladder.clear()
        took, last = 0.0, top      # device memory the last bucket captured took, its size
        for b in wanted[1:]:
            # a bucket's graphs take their fixed part and about its rows' share of what the
            # last one took beyond that; where that would leave too little free, the bucket is
            # skipped (its beats pad to the next one up) and a smaller one may still fit
            before, total = torch.cuda.mem_get_info()
            free = planned_memory(before, total, self.options.gpu_share,
                                  torch.cuda.memory_reserved())
            if b > SMALL_FIRST >= last:
                took, last = 0.0, top   # past the small ones: priced from the larger ones only
            need = max(0.0, took - GRAPH_FIXED_BYTES) * b / last + GRAPH_FIXED_BYTES
            fits = free - need >= LADDER_KEEP_FREE
            if not fits or not self.prepare(b, optional=True):
                self.ladder[b] = {"free_gb": round(free / 1e9, 2), "need_gb": round(need / 1e9, 2),
                                  "skipped": "memory" if fits else "estimate"}
                continue
            took, last = max(0, before - torch.cuda.mem_get_info()[0]), b
            self.ladder[b] = {"free_gb": round(free / 1e9, 2), "took_gb": round(took / 1e9, 2)}
        skipped = [b for b, fact in self.ladder.items() if "skipped" in fact]
        if skipped:
            log.warning("device memory for beat graphs ran out for the buckets %s: their beats "
                        "pad to the next bucket captured", skipped)
        log.info("captured %d beat graphs (%d buckets) in %.1f s; %.1f GB of device memory "
                 "free", len(self.captured), len(self.buckets()), time.perf_counter() - t0,
                 torch.cuda.mem_get_info()[0] / 1e9)

    def warm_eager(self) -> None:
        """The eager work a beat may queue (a reset with the talker's warm-up, a snapshot copy
        and save, a context roll) run once on the trash slot before serving: their first run
        loads kernels and builds the roll's turn tables, which would land in a live beat."""
        t, runner = self.trash, self.runner
        idx = slice(t, t + 1)           # as `ModelRunner.reset_slots` resets a run of slots
        chunk = self.start_shape.prefill_chunk
        with torch.no_grad():
            self.state.reset(idx)
            self.model.warm(self.state, idx)
            if runner.snapshots.space.entries:
                runner.snapshots.save([(t, 0, chunk)])
                runner.snapshots.copy_in([(t, 0, chunk)])
            self.model.roll(self.state, t, 1, self.options.roll_frames)
            self.state.reset(idx)
            self.model.warm(self.state, idx)
            # scattered resets (calls coming and going) replay one of these
            runner.resets.capture(self.pool, t, self._side)
            runner.snapshots.capture(self.pool, t, self._side)    # and scattered copies
        torch.cuda.synchronize()

    # -- device-time probes: sizing a node, pricing its start rows ----------------------------
    def size_slots(self, most: int, ceiling: int) -> dict:
        """The most sessions, at most `most` (the memory `ceiling`, or the largest bucket), whose
        beat at full context the device runs within ON_TIME_SHARE of a beat (start rows and
        snapshot copies ride in a beat only where they fit: the start policy's budget):
        measured at `most` and at half of it, a line through the two (past the weight reads a
        beat's time grows with its rows) gives a count, and the count is measured in turn until
        it fits. Graphs above it are dropped."""
        budget = beat_budget_s(self.options.gpu_share)
        probes: dict[int, float] = {}

        def fits(n: int) -> bool:
            if n not in probes:
                probes[n] = self.beat_at_context(n)
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
        for key in [k for k in self.captured if k[0] > n]:
            del self.captured[key]
        share = self.options.gpu_share
        of = f" of a {share:.0%} share of the GPU" if share < 1 else ""
        return {"sessions": n, "decided_by": f"the beat without start rows at full context within "
                f"{ON_TIME_SHARE:.0%} of {1e3 * BEAT_S:.0f} ms{of}, under the memory ceiling",
                "memory_ceiling": ceiling, "budget_ms": round(1e3 * budget, 1),
                "beat_ms_at_context": {k: round(1e3 * v, 2) for k, v in sorted(probes.items())}}

    def _fastest_replay(self, g: Captured, replays: int, before=None) -> float:
        """The device time of `g`'s beat, the fastest of `replays` replays (eagerly without a
        graph); `before()` runs ahead of each, outside the timed part."""
        best = math.inf
        for _ in range(replays):
            if before is not None:
                before()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            self.replay(g)
            b.record()
            b.synchronize()
            best = min(best, a.elapsed_time(b) / 1e3)
        return best

    def beat_at_context(self, n: int, replays: int = 3, rows: int = 0) -> float:
        """The device time of the n-session beat (with `rows` start rows, padded) when every one
        of its sessions' caches is full: the fastest of a few replays. What it writes belongs
        to no session (every open resets its slot)."""
        if (n, rows) not in self.captured:
            self._capture(n, rows)
        g = self.captured[n, rows]
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

    def time_start_rows(self, bucket: int, replays: int = 5) -> dict:
        """What the start rows add to the `bucket`-session beat, replayed on the idle device
        (all rows padded: the same kernels as rows in use), the fastest of a few replays each."""
        def fastest(g: Captured) -> float:
            return self._fastest_replay(g, replays)
        shape = self.start_shape
        plain = fastest(self.captured[bucket, 0])
        added = {c: round(1e3 * (fastest(self.captured[bucket, c]) - plain), 2)
                 for c in shape.row_captures if c}
        cost = {"rows": shape.start_rows, "chunk": shape.prefill_chunk,
                "at_sessions": bucket, "beat_ms": round(1e3 * plain, 2),
                "beat_with_rows_ms": round(1e3 * plain + added[shape.start_rows], 2),
                "added_ms": added[shape.start_rows], "added_ms_by_rows": added}
        log.info("start rows: %d rows of %d prompt positions add %.1f ms to the %d-session beat "
                 "(%.1f ms without, idle caches)", cost["rows"], cost["chunk"], cost["added_ms"],
                 bucket, cost["beat_ms"])
        return cost
