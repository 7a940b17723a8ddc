"""Fast mode's frames as counters: per slot, what the callers sent and the network lost, and the
jitter buffer by `jitter_arrays.ArrayScheduler`'s rules, for every slot at once with numpy."""
from __future__ import annotations

import math

import numpy as np

from wave_actors.bench.workload import Call
from wave_actors.core.sched.clock_policy import ClockPolicy
from wave_actors.core.frames import FRAME_S, FRAMES_PER_BEAT

TICK_EPS = 1e-9             # a frame due at the very instant of a plan is not in that beat
FAR = 1e18                  # "never" as a finite time: arithmetic on it stays finite


class Frames:
    """Every slot's frames as counters: the callers' sends and the network (in flight, lost),
    and the jitter buffer (`ArrayScheduler`'s rules: prebuffer, bounded queue dropping the
    oldest, two frames a beat, shedding what the recent window never needed).
    Conservation, per slot and in total: sent = heard + dropped + lost + queued + in flight."""

    STATS = ("sent", "heard", "underruns", "idle", "dropped", "shed", "lost", "out")

    def __init__(self, slots: int, clock: ClockPolicy, rng: np.random.Generator):
        self.prebuffer, self.max_queue, self.shedding = (clock.prebuffer, clock.max_queue,
                                                          clock.shedding)
        w = self.shedding.window_beats if self.shedding else 1
        self.rng = rng
        self.queued = np.zeros(slots, np.int64)
        self.started = np.zeros(slots, bool)
        self.window = np.zeros((slots, w), np.int64)    # spares + frames shed before each
        self.window_beats = np.zeros(slots, np.int64)
        self.shed_total = np.zeros(slots, np.int64)
        self.gen = np.zeros(slots, np.int64)            # bumped at every admit of the slot
        self.stats = {k: np.zeros(slots, np.int64) for k in self.STATS}
        self.totals = {k: 0 for k in self.STATS}        # of sessions released
        # The caller on each slot: sends frame i at open_at + i·80 ms (+ its jitter), i < n.
        self.open_at = np.full(slots, FAR)
        self.n = np.zeros(slots, np.int64)
        self.jitter_s = np.zeros(slots)
        self.loss = np.zeros(slots)
        # Frames in flight (sent, not yet arrived), flat: slot, arrival time. A release takes
        # its slot's, so what is here belongs to the slot's current session.
        self.fly_slot = np.zeros(0, np.int64)
        self.fly_at = np.zeros(0)

    def admit(self, slot: int) -> None:
        for a in (self.queued, self.window_beats, self.shed_total):
            a[slot] = 0
        self.started[slot] = False
        self.gen[slot] += 1
        for a in self.stats.values():
            a[slot] = 0

    def stream(self, slot: int, at: float, call: Call | None, life_s: float) -> int:
        """The caller starts sending at `at` for `life_s`; returns its frames (the last sent
        before `at + life_s`, when it closes)."""
        n = max(1, math.ceil(life_s / FRAME_S - TICK_EPS)) if math.isfinite(life_s) else 1 << 60
        self.open_at[slot], self.n[slot] = at, n
        self.jitter_s[slot] = 0.0 if call is None else call.jitter_ms / 1e3
        self.loss[slot] = 0.0 if call is None else call.loss
        return n

    def release(self, slot: int) -> None:
        """The session closed (after its last frame was due): what it sent and the clock never
        heard is dropped (queued, in flight, or not yet sent in this model's beat steps)."""
        s = self.stats
        mine = self.fly_slot == slot
        unsent = int(self.n[slot] - s["sent"][slot])
        s["sent"][slot] += unsent
        s["dropped"][slot] += int(self.queued[slot]) + int(mine.sum()) + unsent
        self.queued[slot] = 0
        keep = ~mine
        self.fly_slot, self.fly_at = self.fly_slot[keep], self.fly_at[keep]
        self.open_at[slot], self.n[slot] = FAR, 0
        for k, a in s.items():
            self.totals[k] += int(a[slot])
            a[slot] = 0

    def arrive(self, t: float) -> None:
        """Frames sent before `t` (ticks at `t` itself are not) that arrived by then, queued."""
        s = self.stats
        due = np.minimum(np.ceil((t - self.open_at) / FRAME_S - TICK_EPS).clip(0), self.n)
        new = due.astype(np.int64) - s["sent"]
        slots = np.flatnonzero(new > 0)
        if len(slots):
            k = new[slots]
            s["sent"][slots] += k
            rep = np.repeat(slots, k)
            # index of each new frame: its slot's first new one, then the next ...
            first = np.repeat(s["sent"][slots] - k, k)
            idx = first + np.arange(len(rep)) - np.repeat(np.cumsum(k) - k, k)
            at = self.open_at[rep] + idx * FRAME_S
            jit = self.jitter_s[rep]
            if jit.any():                       # frame 0 goes at once; later ones up to late
                at = at + np.where(idx > 0, self.rng.uniform(0.0, 1.0, len(rep)) * jit, 0.0)
            lost = np.zeros(len(rep), bool)
            if self.loss[slots].any():
                lost = self.rng.random(len(rep)) < self.loss[rep]
                np.add.at(s["lost"], rep[lost], 1)
            self.fly_slot = np.concatenate([self.fly_slot, rep[~lost]])
            self.fly_at = np.concatenate([self.fly_at, at[~lost]])
        landed = self.fly_at < t - TICK_EPS
        if landed.any():
            got = np.bincount(self.fly_slot[landed], minlength=len(self.queued))
            self.fly_slot, self.fly_at = self.fly_slot[~landed], self.fly_at[~landed]
            q = self.queued + got
            over = np.maximum(0, q - self.max_queue)        # the oldest make room
            s["dropped"] += over
            self.queued = q - over

    def pack(self, slots: np.ndarray) -> None:
        """The beat takes two frames of each live slot (`ArrayScheduler.pack`)."""
        s = self.stats
        count = self.queued[slots]
        started = self.started[slots] | (count >= self.prebuffer)
        self.started[slots] = started
        taken = np.where(started, np.minimum(count, FRAMES_PER_BEAT), 0)
        left = count - taken
        self.queued[slots] = left
        missing = FRAMES_PER_BEAT - taken
        s["heard"][slots] += taken
        s["underruns"][slots] += np.where(started, missing, 0)
        s["idle"][slots] += np.where(started, 0, FRAMES_PER_BEAT)
        if self.shedding:
            self._shed(slots[started], (left - missing)[started])

    def _shed(self, slots: np.ndarray, spare: np.ndarray) -> None:
        w = self.window.shape[1]
        beats = self.window_beats[slots]
        self.window[slots, beats % w] = spare + self.shed_total[slots]
        self.window_beats[slots] = beats + 1
        slots = slots[beats + 1 >= w]
        if not len(slots):
            return
        keep = self.shedding.keep
        lowest = self.window[slots].min(axis=1) - self.shed_total[slots]
        n = np.where(lowest > keep, np.minimum(np.minimum(lowest - keep, self.shedding.per_beat),
                                               self.queued[slots]), 0)
        self.queued[slots] -= n
        self.shed_total[slots] += n
        self.stats["shed"][slots] += n
        self.stats["dropped"][slots] += n

    def complete(self, slots: np.ndarray, gens: np.ndarray) -> None:
        """A beat's outputs reach the slots still held by the session packed."""
        self.stats["out"][slots[self.gen[slots] == gens]] += FRAMES_PER_BEAT

    def total(self, key: str) -> int:
        return self.totals[key] + int(self.stats[key].sum())

    def in_flight(self) -> int:
        return len(self.fly_at)
