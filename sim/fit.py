"""`python -m sim.fit <bench JSON…> [-o sim/costmodel_h200_<profile>.json]`: a cost model
fitted from measured GPU bench results of one profile, with its held-out error.

What it fits, from every measured beat (`per_run[i].trace`) of the files:
  - the executor's beat (compute_ms) by batch size. The engine pads a beat's batch to a captured
    bucket (gpu/engine/graph/beat_graphs.py `graph_for`: the smallest captured bucket that holds
    the live sessions; `extra.engine.buckets_captured` says which were captured), so a beat's
    time depends on its bucket, not its live count: beats are grouped by bucket and each group's
    median is a point (`CostModel.beat_points`);
  - jitter: each beat's time over its point (or, fitted by least squares, over its
    prediction), less one, kept as quantiles (`residuals`); where the trace says which beats
    carried start rows, theirs apart (`row_residuals`): a row's work spreads far more than a
    live beat's, and a policy that reads the beats without rows (`headroom`) must see their
    own spread;
  - the host's time outside the executor: latency − compute of each beat (frames read and
    packed before the call, the loop's late wake and garbage collection between beats among
    them, outputs routed after the return), kept as quantiles (`host_s`). A beat after one
    that overran is left out: its executor call first waited for the GPU to finish the
    previous beat, a wait the simulator makes itself (it starts a beat at the previous one's
    end at the earliest), so counting it as host time would count it twice;
  - what a beat's other work adds: where every file's trace says what each beat carried
    (`rows`, `resets`, `rolls`), the beats are fitted together by least squares: a time per
    bucket (its point, at no other work) plus one per row capture replayed (full, small), per
    slot reset and per context roll, per roll in a beat with rows, and once for each file's
    first beat that rolled, where it carried no start rows (the roll path's first use;
    beside the rows' work it hid within their spread: `start_rows_s`, `small_rows_s`,
    `reset_s`, `roll_s`, `row_roll_s`, `first_roll_s`), and one per prompt-snapshot copy
    (`copy_s`) and once a beat that copies (`copy_beat_s`) where a trace counts them
    (`copies`; a trace without the column copied nothing; where no beat copied, or the copies
    cannot be told from the resets they came with, `copy_s` stays the prior of
    `sim/costmodel.json`, as `save_s` always does, and `copy_beat_s` is not fitted);
    once, then again without the beats the first fit missed by more than TRIM_MADS median
    absolute deviations (a GC pause, a stall), and a part the beats cannot tell (never carried,
    or a fitted time below zero) is left out and taken from elsewhere. Traces without those
    columns (older results): the bucket's median is its point, and start rows come from beats
    that carried rows and reset no slots (each run's `ramp.slowest`, the engine's
    `slow_beats`), less their bucket's point, median by row capture; without such beats, the
    engine's own measure at build (`extra.engine.start_rows`, on idle caches);
  - `first_frame_share` (frame 0 routed, less the host's time before the call, over the
    executor's beat) and the memory plan (weights, state a session, the ceiling).
With `--stages` (bench/graph_stages.py results of the profile) the model also holds each
stage's line in the batch size (`sim/stages.py`): the beat grows as their sum past the largest
measured batch, and `--stage-speedup stage=factor` makes a what-if model with those stages
faster.
Held-out error: each file left out in turn, the model fitted on the rest predicts its beats
(p50/p99 latency, mean compute) by drawing at its live counts; a table, and `_heldout`.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from sim import stages as sim_stages
from sim.costmodel import DEFAULT_PATH, CostModel
from sim.measured import FitError, Measured, first_rolls, read
from wave_actors.core.sched.start_shape import StartShape

MIN_BEATS = 10          # beats of one bucket that make a point
TRIM_MADS = 6.0         # a beat this far off the first least-squares fit is left out of the second
QUANTILES = 256         # values kept of each measured distribution
START_SHAPE = StartShape()      # the GPU executor's row captures (the sim's too)


def check_same(measured: list[Measured]) -> None:
    for what in ("profile", "context"):
        seen = sorted({str(getattr(m, what)) for m in measured})
        if len(seen) > 1:
            raise FitError(f"mixed {what}s {seen}: fit one {what} at a time")


def _quantiles(values: np.ndarray, digits: int = 7) -> list[float]:
    q = (np.arange(QUANTILES) + 0.5) / QUANTILES
    return [round(float(v), digits) for v in np.quantile(values, q)]


def fit_params(measured: list[Measured]) -> dict:
    """The fitted CostModel fields (seconds), and what they were fitted from (`_fit`)."""
    batch = np.concatenate([m.batch for m in measured])
    compute = np.concatenate([m.compute_s for m in measured])
    groups = {int(b): compute[batch == b] for b in np.unique(batch)}
    sizes = sorted(b for b, v in groups.items() if len(v) >= MIN_BEATS)
    if not sizes:
        raise FitError(f"no batch size with {MIN_BEATS} measured beats or more")
    keep = np.isin(batch, sizes)
    columns = all(m.carried is not None for m in measured)
    if columns:
        carried = np.concatenate([m.carried for m in measured])[keep]
        first = np.concatenate([first_rolls(m.carried) for m in measured])[keep]
        points, extra, predicted, rows_fit = _least_squares(batch[keep], carried, first,
                                                            compute[keep], sizes)
        rows = {k: round(v, 5) for k, v in extra.items()}
        if not {"start_rows_s", "small_rows_s"} <= set(rows):
            found, how = _fit_rows(measured, points)
            rows = {**found, **rows}
            rows_fit["rows_elsewhere"] = how
    else:
        points = [(b, float(np.median(groups[b]))) for b in sizes]
        at = dict(points)
        predicted = np.array([at[int(b)] for b in batch[keep]])
        rows, rows_fit = _fit_rows(measured, points)
    resid = compute[keep] / predicted - 1.0
    with_rows = (np.concatenate([m.carried[:, 0] for m in measured])[keep] > 0
                 if columns else np.zeros(len(resid), bool))
    apart = with_rows.sum() >= MIN_BEATS and (~with_rows).sum() >= MIN_BEATS
    host = np.clip(np.concatenate([m.host_s for m in measured]), 0.0, None)
    params = {"beat_points": [[b, round(t, 7)] for b, t in points],
              "points_context": [min(m.held[0] for m in measured),
                                 max(m.held[1] for m in measured)],
              "residuals": _quantiles(resid[~with_rows] if apart else resid),
              "row_residuals": _quantiles(resid[with_rows]) if apart else [],
              "host_s": _quantiles(host), "jitter_rel": 0.0}
    params.update(rows)
    shares = [s for m in measured for s in m.first_shares]
    if shares:
        params["first_frame_share"] = round(float(np.median(shares)), 3)
    gc = np.concatenate([m.gc_s for m in measured])
    params["_fit"] = {
        "beats": int(len(compute)), "beat_ms_by_batch": {b: round(1e3 * t, 2) for b, t in points},
        "beats_by_batch": {b: int(len(groups[b])) for b, _ in points},
        "residual_pct": _spread(100 * resid[~with_rows] if apart else 100 * resid),
        "row_residual_pct": _spread(100 * resid[with_rows]) if apart else None,
        "host_ms": _spread(1e3 * host),
        "gc_ms": {**_spread(1e3 * gc), "beats_with_gc": int((gc > 0).sum())},
        "start_rows": rows_fit, "first_frame_shares": [round(s, 3) for s in shares]}
    return params


def _least_squares(batch: np.ndarray, carried: np.ndarray, first_roll: np.ndarray,
                   compute: np.ndarray, sizes: list[int]) -> tuple[list, dict, np.ndarray, dict]:
    """Each beat's executor time as its bucket's time plus what it carried (module doc):
    (points, {field: seconds} for the parts the beats tell, each beat's prediction, notes)."""
    rows, resets, rolls, copies = carried.T
    capture = np.array([START_SHAPE.capture_for(int(r)) for r in rows])
    parts = {"start_rows_s": (rows > 0) & (capture == START_SHAPE.start_rows),
             "small_rows_s": (rows > 0) & (capture < START_SHAPE.start_rows),
             "reset_s": resets, "roll_s": rolls, "row_roll_s": np.where(rows > 0, rolls, 0),
             "first_roll_s": first_roll & (rows == 0), "copy_s": copies,
             "copy_beat_s": copies > 0}
    names = [k for k, v in parts.items() if np.any(v)]
    base = (batch[:, None] == np.array(sizes)[None, :]).astype(float)
    for part in ("copy_s", "copy_beat_s"):
        # copies only ever with as many resets, or one a beat: the parts are not told apart
        if part in names and (part == "copy_s" or "copy_s" in names):
            cols = [np.asarray(parts[k], float)[:, None] for k in names if k != part]
            x = np.hstack([base] + cols)
            if np.linalg.matrix_rank(np.hstack([x, np.asarray(parts[part], float)[:, None]])) \
                    <= np.linalg.matrix_rank(x):
                names.remove(part)
        elif part in names:
            names.remove(part)
    used = np.ones(len(compute), bool)
    for _ in range(2):                  # the fit; then without the beats it missed far
        while True:
            x = np.hstack([base] + [np.asarray(parts[k], float)[:, None] for k in names])
            coef, *_ = np.linalg.lstsq(x[used], compute[used], rcond=None)
            negative = [k for k, c in zip(names, coef[len(sizes):]) if c < 0]
            if not negative:
                break
            names = [k for k in names if k not in negative]
        miss = compute - x @ coef
        mad = max(float(np.median(np.abs(miss[used] - np.median(miss[used])))), 1e-6)
        used = np.abs(miss - np.median(miss[used])) <= TRIM_MADS * mad
    extra = dict(zip(names, (float(c) for c in coef[len(sizes):])))
    notes = {"method": "least squares over every measured beat (rows, resets, rolls"
                       + (", copies)" if np.any(copies) else ")"),
             "beats_used": int(used.sum()), "beats_trimmed": int((~used).sum()),
             "beats_carrying": {k: int(np.count_nonzero(v)) for k, v in parts.items()},
             "added_ms": {k: round(1e3 * v, 2) for k, v in extra.items()},
             "not_told": [k for k in parts if k not in extra]}
    return ([(b, float(c)) for b, c in zip(sizes, coef[:len(sizes)])], extra, x @ coef, notes)


def _spread(x: np.ndarray) -> dict:
    p50, p99, top = np.percentile(x, [50, 99, 100]) if len(x) else (0.0, 0.0, 0.0)
    return {"p50": round(float(p50), 3), "p99": round(float(p99), 3), "max": round(float(top), 3)}


def _fit_rows(measured: list[Measured], points: list) -> tuple[dict, dict]:
    """start_rows_s / small_rows_s from beats with rows (their bucket's point taken off), by
    the row capture they replayed; the engine's idle-cache measure where none were seen."""
    base = CostModel.load(DEFAULT_PATH, measured[0].profile)
    model = replace(base, beat_points=tuple(tuple(p) for p in points))
    added: dict[int, list[float]] = {}
    for m in measured:
        for batch, rows, seconds in m.row_beats:
            added.setdefault(START_SHAPE.capture_for(rows), []).append(
                seconds - model.beat_time(batch, model.points_context[0]))
    full, small = START_SHAPE.start_rows, START_SHAPE.small_rows
    eng = (measured[-1].engine.get("start_rows") or {}).get("added_ms_by_rows") or {}
    out, how = {}, {"beats_by_capture": {c: len(v) for c, v in sorted(added.items())}}
    if added.get(full):
        out["start_rows_s"] = float(np.median(added[full]))
        how["start_rows_from"] = "ramp beats with rows, no resets"
    elif str(full) in eng:
        out["start_rows_s"] = eng[str(full)] / 1e3
        how["start_rows_from"] = "engine at build (idle caches)"
    if added.get(small):
        out["small_rows_s"] = float(np.median(added[small]))
        how["small_rows_from"] = "ramp beats with rows, no resets"
    elif "start_rows_s" in out and str(small) in eng and eng.get(str(full)):
        out["small_rows_s"] = out["start_rows_s"] * eng[str(small)] / eng[str(full)]
        how["small_rows_from"] = "the full capture's, scaled as the engine measured at build"
    out = {k: round(v, 5) for k, v in out.items()}
    how["added_ms"] = {k: round(1e3 * v, 2) for k, v in out.items()}
    return out, how


def memory_params(engine: dict) -> dict:
    """The engine's memory plan as the sim's: a slot's state is reserved at the full context
    whatever a session holds (so none of it scales with the held context), and the workspace
    leaves room for exactly the engine's ceiling of sessions."""
    need = ("weights_bytes", "state_bytes_per_session", "memory_total_bytes",
            "memory_ceiling_sessions")
    if not all(engine.get(k) for k in need):
        return {}
    state = engine["state_bytes_per_session"]
    usable = float(engine["memory_total_bytes"])
    ceiling = engine["memory_ceiling_sessions"]
    return {"usable_bytes": usable, "weights_bytes": float(engine["weights_bytes"]),
            "workspace_bytes": usable - engine["weights_bytes"] - (ceiling + 0.5) * state,
            "state_fixed_bytes": state, "state_bytes_per_frame": 0}


def build(measured: list[Measured], stages: dict | None = None) -> dict:
    """The cost-model JSON: the roofline's defaults (for other contexts and past the largest
    measured batch) with the fitted fields over them; `stages` (`sim.stages.read`, with its
    `stage_speedup` if any): the beat's per-stage shape."""
    check_same(measured)
    prof_name = measured[0].profile
    default = json.loads(DEFAULT_PATH.read_text())
    raw = {k: v for k, v in default.items() if not k.startswith("_") and k != "profiles"}
    profile = dict(default["profiles"][prof_name])
    fitted = fit_params(measured)
    fit_notes = fitted.pop("_fit")
    if "first_frame_share" in fitted:
        profile["first_frame_share"] = fitted.pop("first_frame_share")
    mem = memory_params(measured[-1].engine)
    for key in ("state_fixed_bytes", "state_bytes_per_frame"):
        if key in mem:
            profile[key] = mem.pop(key)
    if "start_rows_s" in fitted and "small_rows_s" not in fitted:
        raw["small_rows_s"] = None              # the fitted full capture's cost for both
    raw.update(fitted)
    raw.update(mem)
    stage_notes = {}
    if stages:
        raw["stages"] = stages["stages"]
        raw["stage_speedup"] = stages.get("stage_speedup", {})
        stage_notes = {"_stages_from": stages["_stages_from"]}
    sources = [{"file": Path(m.path).name, "commit": m.commit, "backend": m.backend,
                "beats": int(len(m.compute_s))} for m in measured]
    return {"_source": f"sim.fit on {len(measured)} measured {measured[0].gpu} bench results, "
                       f"{prof_name} profile at {measured[0].context} frames of context; "
                       f"roofline fields from {DEFAULT_PATH.name} (used only for other contexts "
                       f"and past the largest measured batch)",
            "_fitted_from": sources, **stage_notes, "_fit": fit_notes, **raw,
            "profiles": {prof_name: profile}}


def model_of(doc: dict) -> CostModel:
    return CostModel.from_doc(doc, next(iter(doc["profiles"])))


def predict(model: CostModel, m: Measured, seed: int) -> dict:
    """Draws for each of `m`'s beats at the batch its engine replayed (its live count padded
    to the buckets the file's engine captured): p50/p99 latency and mean compute, ms."""
    rng = random.Random(seed)
    carried = m.carried if m.carried is not None else np.zeros((len(m.live), 4), int)
    parts = np.array([model.draw_parts(int(n), sum(m.held) / 2, int(rows),
                                       START_SHAPE.capture_for(int(rows)),
                                       START_SHAPE.start_rows, rng, int(resets), int(rolls),
                                       bool(first), int(copies))
                      for n, (rows, resets, rolls, copies), first in zip(m.batch, carried,
                                                                        first_rolls(carried))])
    lat = 1e3 * parts.sum(axis=1)
    return {"p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "mean_compute_ms": float(1e3 * parts[:, 0].mean())}


def observed(m: Measured) -> dict:
    lat = 1e3 * m.latency_s
    return {"p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "mean_compute_ms": float(1e3 * m.compute_s.mean())}


def heldout(measured: list[Measured], seed: int = 0) -> dict:
    """Leave one file out: fit on the others, predict it; errors in % of the measured."""
    if len(measured) < 2:
        return {"note": "one input file: nothing to hold out", "rows": []}
    rows = []
    for i, m in enumerate(measured):
        model = model_of(build(measured[:i] + measured[i + 1:]))
        got, want = predict(model, m, seed), observed(m)
        err = {k: round(100 * (got[k] - want[k]) / want[k], 2) for k in want}
        rows.append({"file": Path(m.path).name,
                     "measured": {k: round(v, 2) for k, v in want.items()},
                     "predicted": {k: round(v, 2) for k, v in got.items()}, "error_pct": err})
    worst = {k: max(abs(r["error_pct"][k]) for r in rows) for k in rows[0]["error_pct"]}
    return {"method": "leave one file out; drawn at the held-out file's replayed batches",
            "seed": seed, "rows": rows, "max_abs_error_pct": worst}


def table(held: dict) -> str:
    lines = [f"{'held-out file':48} {'p50 ms':>15} {'p99 ms':>15} {'compute ms':>15}  "
             f"err % p50/p99/compute"]
    for r in held["rows"]:
        m, p, e = r["measured"], r["predicted"], r["error_pct"]
        cell = lambda k: f"{m[k]:6.1f}→{p[k]:6.1f}".rjust(15)
        lines.append(f"{r['file']:48} {cell('p50_ms')} {cell('p99_ms')} "
                     f"{cell('mean_compute_ms')}  {e['p50_ms']:+.1f} / {e['p99_ms']:+.1f} / "
                     f"{e['mean_compute_ms']:+.1f}")
    return "\n".join(lines) if held["rows"] else held["note"]


def default_out(m: Measured) -> Path:
    gpu = m.gpu.split()[-1].lower()
    return Path(__file__).with_name(f"costmodel_{gpu}_{m.profile}.json")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.fit", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("files", nargs="+", help="GPU bench result JSONs of one profile")
    ap.add_argument("-o", "--out", help="default: sim/costmodel_<gpu>_<profile>.json")
    ap.add_argument("--seed", type=int, default=0, help="the held-out prediction's draws")
    ap.add_argument("--note", help="why these files (recorded as `_note`)")
    ap.add_argument("--stages", nargs="+", metavar="STAGES_JSON", default=[],
                    help="bench/graph_stages.py results of the profile: the beat's per-stage "
                         "shape (sim/stages.py)")
    ap.add_argument("--stage-speedup", nargs="+", metavar="STAGE=FACTOR", default=[],
                    help="with --stages: run these stages FACTOR times faster (a what-if)")
    args = ap.parse_args(argv)
    if args.stage_speedup and not args.stages:
        print("sim.fit: --stage-speedup needs --stages", file=sys.stderr)
        return 2
    try:
        measured = [read(p) for p in args.files]
        stages = None
        if args.stages:
            stages = sim_stages.read(args.stages, measured[0].profile)
            stages["stage_speedup"] = sim_stages.speedups(args.stage_speedup, stages["stages"])
        doc = build(measured, stages)
    except (FitError, sim_stages.StagesError) as exc:
        print(f"sim.fit: {exc}", file=sys.stderr)
        return 2
    held = heldout(measured, args.seed)
    doc = {**({"_note": args.note} if args.note else {}), **doc, "_heldout": held}
    out = Path(args.out) if args.out else default_out(measured[0])
    out.write_text(json.dumps(doc, indent=1) + "\n")
    fit = doc["_fit"]
    print(f"fitted {measured[0].profile} from {len(measured)} files, {fit['beats']} beats: "
          f"beat ms by batch {fit['beat_ms_by_batch']}, what a beat "
          f"carried adds {fit['start_rows']['added_ms']} ms, host ms {fit['host_ms']}")
    print(table(held))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
