"""Synthetic GPU bench results for the cost-model fit and `sim.validate` tests: beats that
follow a known model, and traces that say what each beat carried."""
import json

import numpy as np

from sim import fit

BEAT_S, HOST_S, ROWS_S = 0.100, 0.002, 0.020      # the known model the synthetic runs follow


def bench_json(path, profile="reference", sessions=100, beats=200, backend="graph",
               gpu="NVIDIA H200", seed=0, trace=True, command=None):
    """A GPU-like bench result whose beats follow BEAT_S (±1 % noise), HOST_S and ROWS_S."""
    rng = np.random.default_rng(seed)
    compute = BEAT_S * (1 + 0.01 * rng.standard_normal(beats))
    latency = compute + HOST_S
    ms = lambda xs: [round(1e3 * float(x), 3) for x in xs]
    ramp = [{"beat": b, "compute_ms": 1e3 * (BEAT_S + ROWS_S), "wake_ms": 0.0,
             "sessions": 16 * b, "rows": 16, "resets": 0, "rolls": 0} for b in range(1, 6)]
    run = {"sessions": sessions, "beats": beats, "late_beats": 0,
           "p50_ms": float(np.percentile(1e3 * latency, 50)),
           "p99_ms": float(np.percentile(1e3 * latency, 99)), "refusals": 0,
           "open_p50_ms": 160.0, "open_p99_ms": 240.0, "compute_p50_ms": 1e3 * BEAT_S,
           "ramp": {"beats": 5, "slowest": ramp},
           "trace": {"latency_ms": ms(latency), "compute_ms": ms(compute),
                     "gc_ms": [0.0] * beats, "sessions": [sessions] * beats} if trace else {}}
    doc = {"backend": backend, "profile": profile, "context": 1500, "sessions": sessions,
           "runs": 1, "beats": beats, "late_beats": 0, "p50_ms": run["p50_ms"],
           "p99_ms": run["p99_ms"], "virtual": backend == "sim", "gpu": gpu, "commit": "abc1234",
           "command": command or f"python -m wave_actors.bench --backend {backend} --profile "
                                 f"{profile} --sessions {sessions} --beats {beats} --out x",
           "per_run": [run], "extra": {"engine": {"buckets_captured": [sessions]}}}
    path.write_text(json.dumps(doc))
    return str(path)


RESET_S, ROLL_S, ROW_ROLL_S, SMALL_S = 0.003, 0.0015, 0.001, 0.008


def carried_json(path, seed=0, beats=400, sessions=100, row_noise=0.005, first_roll_s=0.0):
    """A GPU-like result whose trace says what each beat carried, and whose beats cost
    BEAT_S + the rows' capture + RESET_S a reset + ROLL_S a roll, ROW_ROLL_S more in a beat
    with rows (±0.5 % noise), with a few
    GC-like spikes the fit must not take for work. With `first_roll_s`, no beat rolls before
    beat 20, which rolls without start rows and costs that much more."""
    rng = np.random.default_rng(seed)
    rows = rng.choice([0, 0, 0, 1, 3, 16], beats)
    resets = np.where(rows > 0, rng.integers(0, 3, beats), 0)
    rolls = rng.integers(0, 5, beats)
    if first_roll_s:
        rolls[:20], rolls[20], rows[20], resets[20] = 0, 2, 0, 0
    capture = np.array([fit.START_SHAPE.capture_for(int(r)) for r in rows])
    compute = (BEAT_S + np.where(rows == 0, 0.0, np.where(capture < 16, SMALL_S, ROWS_S))
               + RESET_S * resets + (ROLL_S + ROW_ROLL_S * (rows > 0)) * rolls) \
        * (1 + np.where(rows > 0, row_noise, 0.005) * rng.standard_normal(beats))
    compute[20] += first_roll_s
    compute[::97] += 0.030
    path = bench_json(path, sessions=sessions, beats=beats, seed=seed)
    doc = json.loads(open(path).read())
    ms = lambda xs: [round(1e3 * float(x), 3) for x in xs]
    doc["per_run"][0]["trace"].update(compute_ms=ms(compute), latency_ms=ms(compute + HOST_S),
                                      rows=rows.tolist(), resets=resets.tolist(),
                                      rolls=rolls.tolist())
    open(path, "w").write(json.dumps(doc))
    return path
