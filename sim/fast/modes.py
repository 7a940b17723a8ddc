"""The fast mode's two ways to drive a run (`sim.fast.fast`): the bench's closed loop of lines, and
a workload's calls from their arrivals; the call each caller is, and the order of events at one
instant."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.fast.config import FastError
from sim.frame_counters import TICK_EPS
from wave_actors.bench import deadlines
from wave_actors.bench.results import WARMUP_BEATS
from wave_actors.bench.workload import Call
from wave_actors.core.frames import BEAT_S

MAX_BEATS = 2_000_000       # a run that never gets going stops here with an error
OBSERVE, PLAN, CALLER = 0, 1, 2     # order of events at one instant


@dataclass
class Caller:
    """One call: a workload's, or a closed-loop line's current one."""
    record: deadlines.CallRecord
    call: Call | None = None
    line: int = -1                  # closed loop: its line
    life_s: float = math.inf
    pause_s: float = 0.0            # workload: the wait before its next redial
    slot: int = -1
    dialed_s: float = 0.0           # its latest dial
    ends_s: float = math.inf        # when its last frame is out (its close; a stop moves it)



def closed_loop(run) -> slice:
    """`lines` callers from time 0; the measured beats as the bench picks them: polls every
    beat from 0 until each line's first open was answered (`_wait_live`), then until 8
    beats in a row were on time or `warmup_max` beats passed (`_wait_steady`), then until
    `beats` more had ended (`_wait_beats`); then the lines stop (`stop_lines`) and the run goes
    on until the last session closed (the drain)."""
    cfg = run.cfg
    first_beat = run.warm_up()
    run.lines = [np.random.default_rng([run.seed, line]) for line in range(cfg.lines)]
    for line in range(cfg.lines):
        run.at(0.0, CALLER, run.line_call, line)
    poll, steady_from, first, stop = 0, None, None, None
    for k in range(first_beat, MAX_BEATS):
        plan_t = run.beat(k)
        if stop is not None:
            if run.idle() and not run.waiting:
                return slice(int(first), int(first) + cfg.beats)
            continue
        while stop is None and poll * BEAT_S <= plan_t:
            p = poll * BEAT_S
            n = np.searchsorted(run.rec["end"], p)            # beats ended before p
            lat = run.rec["latency"][max(0, n - WARMUP_BEATS):n]
            if first is not None:
                if n - first >= cfg.beats:
                    stop = p
                    run.at(p, CALLER, run.stop_lines)
            elif steady_from is None:
                answered = (np.searchsorted(run.opened_at, p)
                            + np.searchsorted(run.refused_at, p))
                if n and answered >= cfg.lines:
                    steady_from = n
            elif n - steady_from >= cfg.warmup_max or (
                    n - steady_from >= WARMUP_BEATS and max(lat) <= BEAT_S):
                first = n
            poll += 1
    raise FastError(f"the closed loop never measured {cfg.beats} beats in {MAX_BEATS}")

def open_workload(run) -> slice:
    """Every call from its arrival until the last one ends (or `beats` beats ran); the
    measured beats: those released in the workload's `window_s` (after the occupancy
    form's fill), else every one (`bench_records._workload_window`)."""
    wl, cap = run.cfg.workload, run.cfg.beats or MAX_BEATS
    k = run.warm_up()
    for i, call in enumerate(wl.calls):
        rec = deadlines.CallRecord(i, call.at_s)
        run.calls.append(rec)
        run.at(call.at_s, CALLER, run.dial,
                Caller(rec, call, life_s=call.duration_s, pause_s=call.redial_after_s))
    run.unfinished = len(wl.calls)
    while run.unfinished and k < cap:
        if run.idle() and run.events:       # nothing runs till the next call: skip there
            k = max(k, int(run.events[0][0] / BEAT_S) + 1)
            if k >= cap:
                break
        run.beat(k)
        k += 1
    if k >= MAX_BEATS:
        raise FastError(f"the workload did not end in {MAX_BEATS} beats")
    span = wl.window_s
    if span is None:
        return slice(0, len(run.rec["end"]))
    rel = np.asarray(run.rec["release"])
    lo, hi = np.searchsorted(rel, span[0] - TICK_EPS), np.searchsorted(rel, span[1] - TICK_EPS)
    return slice(int(lo), int(hi))
