"""A fast-mode run's figures as the bench reports them (`bench.results.RunResult`): the headline
over every beat with a live session, each window (ramp, measured, drain), the trace of the
measured beats, and the beats its calls' deadline metrics are matched against."""
from __future__ import annotations

import numpy as np

from wave_actors.bench.results import WINDOW_OF, RunResult
from wave_actors.clock.clock import LATE_AFTER_S
from wave_actors.core.frames import BEAT_S
from wave_actors.core.sched.spread import spread_ms


def window(rec: dict, part: slice) -> dict:
    """`bench_records._window` of the beats `part`: beats, late beats, latency p50 / p99 / max
    (ms), the span of releases (s from the run's start)."""
    lat = np.asarray(rec["latency"][part], float)
    if not len(lat):
        return {"beats": 0, "late_beats": 0}
    p50, p99, top = np.percentile(1e3 * lat, [50, 99, 100])
    rel = rec["release"][part]
    return {"beats": len(lat), "late_beats": int((lat > LATE_AFTER_S).sum()),
            "p50_ms": float(p50), "p99_ms": float(p99), "max_ms": float(top),
            "from_s": round(rel[0], 3), "to_s": round(rel[-1] + BEAT_S, 3)}


def run_result(run, measured: slice) -> RunResult:
    """A fast-mode run (`fast._Run`, at least one beat with a session) as the bench reports it: the headline over every beat with a live session
    (first open to last close), the trace and the backend's times over the measured
    beats, `windows` for each part (`bench.WINDOW_OF`)."""
    cfg = run.cfg
    every = slice(0, len(run.rec["end"]))
    whole = window(run.rec, every)
    r = {k: np.asarray(v[measured], float) for k, v in run.rec.items()}
    lat, gpu = 1e3 * r["latency"], 1e3 * r["compute"]
    gpu_or_0 = gpu if len(gpu) else np.zeros(1)
    ms = np.array(run.waits) * 1e3 if run.waits else np.zeros(1)
    o50, o99, omax = np.percentile(ms, [50, 99, 100])
    live = r["sessions"].astype(int)
    live_or_0 = live if len(live) else np.zeros(1, int)
    n = cfg.slots if cfg.workload is not None else cfg.lines
    f = run.frames
    res = RunResult(
        n, whole["beats"], whole["late_beats"], whole["p50_ms"], whole["p99_ms"],
        whole["max_ms"], float(gpu_or_0.mean()),
        f.total("underruns"), f.total("dropped"), sum(run.refused.values()),
        f.total("heard"), f.total("out"), 0,
        float(np.percentile(gpu_or_0, 50)), float(np.percentile(gpu_or_0, 99)),
        {"latency_ms": [round(x, 1) for x in lat.tolist()],
         "compute_ms": [round(x, 1) for x in gpu.tolist()],
         "sessions": live.tolist(),
         **{k: r[k].astype(int).tolist() for k in ("rows", "resets", "rolls", "copies")}},
        round(1e3 * float(r["begin"][0]), 1) if len(lat) else 0.0, len(run.waits),
        float(o50), float(o99),
        {"start": run.policy.describe()}, float(omax), dict(run.refused),
        {"offered": n, "min": int(live_or_0.min()),
         "p50": float(np.percentile(live_or_0, 50)), "max": int(live_or_0.max())})
    res.windows = {"all": whole, "ramp": window(run.rec, slice(0, measured.start)),
                   "measured": window(run.rec, measured),
                   "drain": window(run.rec, slice(measured.stop, every.stop))}
    res.window_of = dict(WINDOW_OF)
    if cfg.workload is None:
        ran = run.rec["ran"][measured.start] if len(lat) else len(run.ramp_compute)
        before = run.ramp_compute[:ran]
        res.ramp = {"beats": len(before), "compute_ms": spread_ms(before)}
    res.open_waits_ms = [round(float(w), 1) for w in ms] if run.waits else []
    return res


def deadline_beats(rec: dict) -> list[tuple[float, float, bool]]:
    """Every beat with a live session, as the bench gives its deadline metrics: a call is
    matched against the beats of its whole life, the ramp's and the drain's included."""
    return [(rel, lat, lat > LATE_AFTER_S) for rel, lat in
            zip(rec["release"], rec["latency"])]
