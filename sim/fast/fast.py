"""Fast mode: the node's scheduling at beat granularity, without the node.

The production scheduler runs unchanged (the `SlotBook` with the start policy object, the GPU's
`StartShape` and the sim executor's prompt snapshots (`sim.executor.snapshot_space`),
`admission()`, the cost model's `draw_beat` on `random.Random(seed)` as the sim executor draws
it, at the bucket of the executor's ladder, snapshot copies and saves priced as it prices them;
the policy is told what the executor measures at build, `know_rows` / `know_beats`, as the
clock tells it); what full emulation spends its time
on (sockets, actors, audio arrays, the event loop) is replaced by the clock's timing rules and
per-slot frame counters:

  - beat k is released at k·160 ms; it is planned at max(release, the previous beat's submit),
    with `time_left_s` 0 when the previous beat still runs, else the deadline less how late it
    was planned and the clock's own share of the last 16 beats (as `clock.py`); it runs from
    max(plan, the previous beat's end) for `draw_beat` seconds; latency = end − release;
  - the callers' events (dials, ends) and the policy's measurements (`book.observe` at each
    beat's end) apply in time order between plans; an event at the very instant of a plan comes
    after it (a caller's message takes loop turns to reach the clock);
  - an open takes a free slot (else `capacity`) if `admission()` lets it (else `admission`),
    opens in the book at the next plan, and is `opened` at the plan that makes it live, or
    when admitted where its whole prompt is kept (the node's promise, PROMISED_MAX at a time);
  - each slot's jitter buffer is counters (queued, started, the shedding window) updated for
    all slots at once with numpy, by the rules of `jitter_arrays.ArrayScheduler`; frames are
    sent every 80 ms from `opened`, late by up to a call's `jitter_ms`, some lost (`loss`).

The two drivers are in `sim.fast.modes`. Closed loop (`lines`, `churn_s`) measures `beats` beats
after every line's first open was answered and the beats were steady, polling as the bench's `_wait_live` / `_wait_steady` /
`_wait_beats` do, then stops the lines as the bench does (each closes at its next frame, no
line dials again) and runs until the last session closed, so its results compare to
`python -m sim.run`'s. A workload runs from the first arrival until the last call ends (or
`beats` beats). As the bench's, a result's headline (beats, late beats, p50 / p99) and its
deadline metrics count every beat with a live session, first open to last close; `windows`
has each part (ramp, measured, drain: `bench.WINDOW_OF`), and the trace the measured beats.
"""
from __future__ import annotations

import copy
import heapq
import math
import random
from dataclasses import dataclass

import numpy as np

from wave_actors.bench import deadlines
from sim.costmodel import CostModel
from sim.executor import measured_at_build, snapshot_space
from sim.fast.config import FastConfig, FastError
from sim.fast.modes import CALLER, OBSERVE, PLAN, Caller, closed_loop, open_workload
from sim.fast.result import deadline_beats, run_result
from sim.frame_counters import TICK_EPS, Frames
from wave_actors.bench.workload import Call
from wave_actors.bench.results import RunResult
from wave_actors.bench.clients import REDIAL_S, call_fields
from wave_actors.clock.clock import LATE_AFTER_S
from wave_actors.clock.slots import promised
from wave_actors.core.frames import BEAT_S, FRAME_S
from wave_actors.core.prompt import fitted_prompt_tokens
from wave_actors.core.sched.slot_book import SlotBook
from wave_actors.core.sched.start_shape import StartShape
from wave_actors.core.sched.snapshots import snapshot_index
from wave_actors.core.sched.start_policy import GuardedStarts, admission
from wave_actors.core.text import ByteFallbackCodec

HOST_BEATS = 16             # the clock's `_host_s` window
STUCK_S = 600.0             # sessions waited this long with no beat carrying any: stuck


@dataclass(frozen=True)
class _Snapshots:
    """What `snapshot_index` reads of an executor: its snapshot space."""
    snapshot_space: object


class _Run:
    """One run: the node's slots, book and clock timing, and its callers, on virtual time."""

    def __init__(self, cfg: FastConfig, seed: int):
        self.cfg, self.seed = cfg, seed
        opts = cfg.options
        self.cost = CostModel.load(cfg.cost_model, cfg.profile)
        self.offset = opts.context_offset
        if self.offset and cfg.slots > self.cost.capacity(self.offset):
            raise FastError(f"{cfg.slots} slots at {self.offset} frames of context do not fit: "
                            f"the modelled device holds {self.cost.capacity(self.offset)}")
        self.shape = StartShape()                 # the GPU executor's, as the sim's
        self.policy = copy.deepcopy(cfg.policy) if cfg.policy is not None else GuardedStarts()
        # what the executor measured at build, told to the policy as the clock tells it
        for know, fact in zip(("know_rows", "know_beats"),
                              measured_at_build(self.cost, self.shape, cfg.slots,
                                                opts.max_context)):
            learn = getattr(self.policy, know, None)
            if learn is not None and fact:
                learn(fact)
        # the sim executor's snapshots: the book it would get from the clock (`snapshot_index`)
        self.snapshots = snapshot_index(_Snapshots(snapshot_space(opts, self.cost, self.shape)),
                                        self.shape.prefill_chunk)
        self.book = SlotBook(cfg.slots, self.shape, self.policy, opts.frames_per_session,
                             opts.roll_frames, self.snapshots)
        self.rng = random.Random(seed)            # SimExecutor's: one draw_beat a submit
        self.rolled = False                       # a beat rolled a context (its first costs)
        self.frames = Frames(cfg.slots, cfg.clock, np.random.default_rng([seed, 0xFA57]))
        self.codec, self._tokens = ByteFallbackCodec(), {}
        self.coin = random.Random(seed + 0xC01)  # who wins a close's race with a frame read
        self.free = list(range(cfg.slots))        # a heap: the lowest free slot first
        self.held: dict[int, Caller] = {}
        self.waiting: dict[int, Caller] = {}     # admitted, not yet opened
        self.promised: set[int] = set()           # opened when admitted, not yet started
        self.ops: list[tuple] = []                # slot changes for the next plan
        self.events: list = []                    # (time, order, seq, fn, args)
        self._seq = 0
        self.calls: list[deadlines.CallRecord] = []
        self.refused: dict[str, int] = {}
        self.opened_at: list[float] = []          # ascending: events run in time order
        self.refused_at: list[float] = []         # ascending: events run in time order
        self.waits: list[float] = []
        self.unfinished = 0                       # workload calls not yet ended or blocked
        self.lines: list[np.random.Generator] = []
        # beats that carried sessions, in order (their ends ascend: one beat runs at a time)
        self.rec = {k: [] for k in ("release", "latency", "compute", "sessions", "begin",
                                    "end", "rows", "resets", "rolls", "copies", "ran")}
        self.ramp_compute: list[float] = []       # every executed beat's time (closed loop)
        self.stopped = False                      # closed loop: the bench told the lines to stop
        self.host: list[float] = []               # the clock's share of recent beats
        self.prev_submit = self.prev_end = -math.inf
        self.live_at = 0.0                        # the latest plan with a live session

    # -- events -----------------------------------------------------------------------------
    def at(self, t: float, order: int, fn, *args) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, order, self._seq, fn, args))

    def _events_before(self, t: float) -> None:
        """Every event before the plan at `t` (a beat's end at `t` itself comes first)."""
        ev = self.events
        while ev and (ev[0][0], ev[0][1]) < (t, PLAN):
            when, _o, _s, fn, args = heapq.heappop(ev)
            fn(when, *args)

    # -- callers ----------------------------------------------------------------------------
    def tokens(self, call: Call | None) -> list[int]:
        key = None if call is None else (call.prompt_chars, call.tools)
        if key not in self._tokens:
            f = {"instructions": "", "tools": []} if call is None else call_fields(call)
            self._tokens[key] = fitted_prompt_tokens(self.codec, f["instructions"], f["tools"],
                                                     self.shape.max_prompt)
        return self._tokens[key]

    def _admit(self, caller: Caller) -> str | None:
        """The clock's `Admit`: the reason it refuses, or None with the slot taken."""
        try:
            tokens = self.tokens(caller.call)
        except ValueError:                        # PromptRejected: too long for the node
            return "invalid"
        if not self.free:
            return "capacity"
        pending = [(kind, slot) for kind, slot, _ in self.ops]
        if admission(self.policy, *self.book.occupancy(pending), len(self.book.slots)):
            return "admission"
        free = set(self.free)
        clean = [s for s in self.book.clean_slots().tolist() if s in free]
        if clean:                                 # as the node's table: a cleaned slot first
            slot = caller.slot = min(clean)
            self.free.remove(slot)
            heapq.heapify(self.free)
        else:
            slot = caller.slot = heapq.heappop(self.free)
        self.frames.admit(slot)
        self.held[slot] = self.waiting[slot] = caller
        self.ops.append(("open", slot, tokens))
        return None

    def _promise(self, caller: Caller) -> bool:
        """The node's promise (`wave_actors.clock.slots`): an open whose whole prompt is kept
        is answered when admitted, a few at a time."""
        waiting = len(self.waiting) - 1 + len(self.promised)     # those admitted before it
        if not promised(self.book.snapshots, self.tokens(caller.call), waiting):
            return False
        self.promised.add(caller.slot)
        return True

    def dial(self, t: float, caller: Caller) -> None:
        rec = caller.record
        rec.tries += 1
        caller.dialed_s = t
        why = self._admit(caller)
        if why is None:
            if self._promise(caller):
                self._opened(t, self.waiting.pop(caller.slot))
            return
        rec.refused.append(why)
        self.refused[why] = self.refused.get(why, 0) + 1
        self.refused_at.append(t)
        if caller.call is None:                   # a closed-loop line: the call dials again
            if self.cfg.churn_s > 0 and not self.stopped:
                self.at(t + REDIAL_S, CALLER, self.line_call, caller.line, rec)
        elif rec.tries > caller.call.redials:
            self.unfinished -= 1                  # blocked
        else:
            self.at(t + caller.pause_s, CALLER, self.dial, caller)
            caller.pause_s *= caller.call.redial_backoff

    def line_call(self, t: float, line: int,
                   rec: deadlines.CallRecord | None = None) -> None:
        """`drive_line`'s next dial on `line`: a new call, or `rec`'s again after a refusal
        (one call, as `drive_line` records it); its length drawn as it dials."""
        if self.stopped:                          # `drive_line` ends: no new dial
            return
        churn = self.cfg.churn_s
        life = float(self.lines[line].exponential(churn)) if churn > 0 else math.inf
        if rec is None:
            rec = deadlines.CallRecord(line, t)           # `drive_line` numbers by line
            self.calls.append(rec)
        self.dial(t, Caller(rec, line=line, life_s=life))

    def _opened(self, t: float, caller: Caller) -> None:
        rec = caller.record
        rec.opened_s = t
        if caller.call is None:         # a line's call waited from the dial that opened it
            rec.asked_s = caller.dialed_s
        self.waits.append(t - rec.asked_s)
        self.opened_at.append(t)
        if caller.call is None:
            self.lines[caller.line].integers(1 << 31)     # the line's audio seed, as drawn
        n = self.frames.stream(caller.slot, t, caller.call, caller.life_s)
        if self.stopped:                          # told to stop: it sends nothing, closes
            self.frames.n[caller.slot] = n = 0
        if math.isfinite(caller.life_s) or self.stopped:
            caller.ends_s = t + n * FRAME_S
            self.at(caller.ends_s, CALLER, self._close, caller)

    def stop_lines(self, t: float) -> None:
        """The bench's `stop` (its measured beats are in): every line's caller stops at its
        next frame (`_stream` checks the stop as it wakes for it; frames due before `t` were
        sent) and closes; a line waiting to dial again, or whose call ends, dials no more."""
        self.stopped = True
        for caller in list(self.held.values()):
            if caller.slot in self.waiting:       # not opened yet: `_opened` closes it
                continue
            at = self.frames.open_at[caller.slot]
            sent = min(int(self.frames.n[caller.slot]),
                       max(0, math.ceil((t - at) / FRAME_S - TICK_EPS)))
            ends = at + sent * FRAME_S
            if ends < caller.ends_s:
                self.frames.n[caller.slot] = sent
                caller.ends_s = ends
                self.at(ends, CALLER, self._close, caller)

    def _close(self, t: float, caller: Caller) -> None:
        """The caller's last frame is out: its session ends once the clock reads its end of
        stream, at the clock's next frame read (every `frames_every_s`). A read due at that
        very instant races the close in the node's loop: either wins, as a coin says. (A close
        a stop moved earlier is the one that counts.)"""
        if t != caller.ends_s:
            return
        every = self.cfg.clock.frames_every_s
        if not every:
            return self._release(t, caller)
        tick = math.ceil(t / every - TICK_EPS) * every
        if abs(tick - t) < TICK_EPS and self.coin.random() < 0.5:
            tick += every
        self.at(max(t, tick), CALLER, self._release, caller)

    def _release(self, t: float, caller: Caller) -> None:
        slot = caller.slot
        self.frames.release(slot)
        self.promised.discard(slot)
        del self.held[slot]
        heapq.heappush(self.free, slot)
        self.ops.append(("close", slot, None))
        caller.record.ended_s = t
        if caller.call is None:
            self.line_call(t, caller.line)
        else:
            self.unfinished -= 1

    def _finish(self, t: float, plan, compute: float, slots: np.ndarray,
                gens: np.ndarray) -> None:
        """A beat's end: the policy measures it, its outputs reach their sessions."""
        self.book.observe(plan, compute)
        self.frames.complete(slots, gens)

    # -- beats ------------------------------------------------------------------------------
    def beat(self, k: int) -> float:
        """Beat k (the clock's `_beat` and `_finish`); returns when it was planned."""
        release = k * BEAT_S
        plan_t = max(release, self.prev_submit)
        self._events_before(plan_t)
        begin = plan_t - release
        behind = self.prev_end > plan_t
        left = 0.0 if behind else LATE_AFTER_S - begin - max(self.host[-HOST_BEATS:],
                                                              default=0.0)
        for kind, slot, tokens in self.ops:
            if kind == "open":
                self.book.open(slot, tokens)
            elif slot not in self.held:           # a slot taken again opens afresh instead
                self.book.close(slot)
        self.ops = []
        plan = self.book.plan(left)
        if self.waiting:
            for slot in [s for s in self.waiting if self.book.ready(s)]:
                self._opened(plan_t, self.waiting.pop(slot))
        self.promised = {s for s in self.promised if not self.book.ready(s)}
        live = np.asarray(plan.live, np.int64)
        if len(live) or not self.held:
            self.live_at = plan_t
        elif plan_t - self.live_at > STUCK_S:
            raise FastError(
                f"no beat carried a session for {STUCK_S:.0f} s while {len(self.held)} waited "
                f"to start (at {plan_t:.1f} s; the start policy's room: {left * 1e3:.1f} ms "
                f"of the beat left): the node's starts are stuck")
        self.frames.arrive(plan_t)
        if len(live):
            self.frames.pack(live)
        start = self.prev_submit = max(plan_t, self.prev_end)   # waits out an overrun
        if not (plan.live or plan.rows or plan.resets or plan.copies):
            return plan_t
        rows = len(plan.rows)
        context = self.offset + (float(plan.context.mean()) if len(live) else 0.0)
        compute = self.cost.draw_beat(len(live), context, rows, self.shape.capture_for(rows),
                                      self.shape.start_rows, self.rng,
                                      resets=len(plan.resets), rolls=len(plan.roll),
                                      first_roll=not self.rolled, copies=len(plan.copies),
                                      saves=len(plan.saves), slots=self.cfg.slots)
        self.rolled = self.rolled or bool(plan.roll)
        end = self.prev_end = start + compute
        self.ramp_compute.append(compute)
        if len(live):
            latency = end - release
            self.host.append(max(0.0, latency - begin - compute))
            for key, v in zip(self.rec, (release, latency, compute, len(live), begin, end,
                                         rows, len(plan.resets), len(plan.roll),
                                         len(plan.copies), len(self.ramp_compute) - 1)):
                self.rec[key].append(v)
        self.at(end, OBSERVE, self._finish, plan, compute, live, self.frames.gen[live])
        return plan_t

    def warm_up(self) -> int:
        """The node's warm-up (`wave_actors/node/warm.py`) before any caller dials: the empty
        prompt admitted, started in beat 0 (its snapshot saved behind its rows) and released
        at once; the callers dial just after that beat's plan, as the bench's do once
        `Node.start` returns. The first beat left to run (0: no warm-up)."""
        if not (self.cfg.warm and self.snapshots is not None):
            return 0
        slot = heapq.heappop(self.free)
        self.frames.admit(slot)
        self.ops.append(("open", slot, self.tokens(None)))
        self.beat(0)
        if not self.book.ready(slot):
            raise FastError("the warm-up's start did not ride in the node's first beat: the "
                            "fast mode models only that warm-up (run it with warm=False)")
        self.frames.release(slot)
        heapq.heappush(self.free, slot)
        self.ops.append(("close", slot, None))
        return 1

    def idle(self) -> bool:
        return not (self.held or self.ops or self.prev_end > self.prev_submit)

    def virtual_s(self) -> float:
        return max(self.rec["end"], default=0.0)


def run_one(cfg: FastConfig, seed: int) -> tuple[RunResult, dict, _Run]:
    """One run of `cfg` drawn from `seed`: its result, its deadline metrics, and the run (for
    tests: the counters, the book, the call records)."""
    run = _Run(cfg, seed)
    measured = closed_loop(run) if cfg.workload is None else open_workload(run)
    if not len(run.rec["latency"]):
        raise FastError("no beat carried a session: nothing to measure")
    res = run_result(run, measured)
    beats = deadline_beats(run.rec)
    offered = cfg.workload.offered_erlangs() if cfg.workload is not None else None
    end = max([c.ended_s or 0.0 for c in run.calls] + [b[0] + BEAT_S for b in beats])
    metrics = deadlines.summarize(run.calls, beats, offered, run_end_s=end)
    return res, metrics, run
