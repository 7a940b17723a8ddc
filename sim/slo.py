"""`python -m sim.slo`: a node's capacity in offered Erlangs under a set of SLOs, by the fast mode.

    python -m sim.slo --workload poisson:rate=1,duration=600,call=90 --slots 300 \\
        --profile dense --cost-model sim/costmodel_h200_dense.json \\
        --slo late=0 p99_ms=150 blocking=0.01 open_p99_ms=3000 --seeds 5

For each seed the workload's load is scaled (a generator's rate parameters multiplied; the
occupancy form's rate, occupancy x slots / hold, multiplied, its fill and measured span kept; a
file's arrival times compressed) and the largest scale whose run meets every SLO is found:
doubling or halving from 1 until the answer flips, then bisection to `--tolerance`. A seed's capacity is
the offered load of the workload it drew at that scale; over the seeds, their mean with a 95 %
Student-t interval. Unlike the bench's find-max (a bisection on N sessions, late beats only),
the load is what callers offer, the SLOs are any of the deadline metrics, and the seeds say how
much of the answer is luck.

SLO keys (every one given must hold): late (late beats, at most), p99_ms (beat latency p99),
blocking (share of calls refused on every try), open_p99_ms (first dial to `opened`, p99).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import sys
from pathlib import Path

from sim.costmodel import DEFAULT_PATH
from sim.fast.fast import FastConfig, FastError, run_one
from wave_actors.bench.workload import Workload, WorkloadError, generate, load, parse_spec
from wave_actors.bench.provenance import stamp as code_stamp
from wave_actors.bench.results import RESULTS
from wave_actors.core.policy_spec import PolicyError, make_policy

# How each SLO key reads a run: (its value from the run's result and deadline metrics).
SLO_KEYS = {
    "late": lambda res, d: res.late_beats,
    "p99_ms": lambda res, d: res.p99_ms,
    "blocking": lambda res, d: d["blocking"],
    "open_p99_ms": lambda res, d: d["open_wait"].get("p99_ms", 0.0),
}
# The arrival-rate parameters of each generator: what a load scale multiplies.
RATE_KEYS = {"poisson": ("rate",), "diurnal": ("peak",), "bursty": ("rate",),
             "flash": ("rate", "calls"), "retry": ("rate", "calls")}
# Two-sided 95 % Student-t quantiles by degrees of freedom (1 to 30; beyond, the normal's).
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
       2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
       2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
MIN_SCALE, MAX_SCALE = 1 / 1024, 1024.0


class SloError(ValueError):
    pass


def parse_slo(words: list[str]) -> dict[str, float]:
    slo = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or key not in SLO_KEYS:
            raise SloError(f"--slo {word!r}: give key=value with keys {', '.join(SLO_KEYS)}")
        try:
            slo[key] = float(value)
        except ValueError:
            raise SloError(f"--slo {word!r}: {value!r} is not a number") from None
    if not slo:
        raise SloError(f"--slo needs at least one of {', '.join(SLO_KEYS)}")
    return slo


def scaled(spec: str, scale: float, seed: int, slots: int | None = None) -> Workload:
    """The workload at `scale` times its load, drawn from `seed`. The occupancy form
    (`poisson:occupancy=X,hold=H`, its slots from `slots=` or `slots`) is drawn at the rate it
    resolves to times `scale` (X x scale may pass 1: more offered than the slots hold), over
    the same arrivals and measured span; at scale 1 it draws the form's own calls."""
    if Path(spec).suffix in (".csv", ".jsonl", ".ndjson", ".json") or Path(spec).exists():
        wl = load(spec, seed)
        calls = tuple(dataclasses.replace(c, at_s=c.at_s / scale) for c in wl.calls)
        return Workload(calls, {**wl.source, "scale": scale})
    name, params = parse_spec(spec)
    if "occupancy" in params:
        form = generate(spec, seed, slots=slots)
        occ = form.source["occupancy"]
        params.pop("occupancy")
        params.pop("slots", None)
        params["rate"] = occ["occupancy"] * occ["slots"] / occ["hold_s"] * scale
        params["duration"] = form.source["params"]["duration"]
        rest = ",".join(f"{k}={v!r}" for k, v in params.items())
        wl = generate(f"{name}:{rest}", seed)
        return Workload(wl.calls, {**wl.source, "spec": spec, "scale": scale, "occupancy": {
            **occ, "occupancy": occ["occupancy"] * scale, "rate_per_s": round(params["rate"], 6),
            "target_erlangs": round(occ["target_erlangs"] * scale, 3)}})
    for key in RATE_KEYS[name]:
        if key in params:
            params[key] *= scale
    rest = ",".join(f"{k}={v!r}" for k, v in params.items())
    return generate(f"{name}:{rest}", seed)


def probe(base: FastConfig, spec: str, slo: dict, scale: float, seed: int) -> dict:
    wl = scaled(spec, scale, seed, slots=base.slots)
    res, d, _run = run_one(dataclasses.replace(base, workload=wl, seed=seed), seed)
    got = {k: SLO_KEYS[k](res, d) for k in slo}
    # blocking whatever the SLO: `sim.plot` draws a search's probes as a blocking curve
    return {"scale": scale, "offered_erlangs": round(wl.offered_erlangs(), 3),
            "blocking": d["blocking"], "ok": all(got[k] <= slo[k] for k in slo),
            "metrics": got}


def search(base: FastConfig, spec: str, slo: dict, seed: int, tolerance: float) -> dict:
    """The largest load scale meeting `slo` for this seed: a bracket by doubling or halving
    from 1, then bisection until the bracket is within `tolerance` (relative)."""
    probes = []

    def ok(scale: float) -> bool:
        probes.append(probe(base, spec, slo, scale, seed))
        return probes[-1]["ok"]

    lo, hi = None, None
    if ok(1.0):
        lo, hi = 1.0, 2.0
        while hi <= MAX_SCALE and ok(hi):
            lo, hi = hi, 2 * hi
    else:
        lo, hi = 0.5, 1.0
        while lo >= MIN_SCALE and not ok(lo):
            lo, hi = lo / 2, lo
    if lo < MIN_SCALE or hi > MAX_SCALE:
        raise SloError(f"seed {seed}: no load scale in [{MIN_SCALE}, {MAX_SCALE}] brackets the "
                       f"SLO boundary")
    while hi / lo > 1 + tolerance:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    best = next(p for p in probes if p["scale"] == lo)
    return {"seed": seed, "scale": lo, "capacity_erlangs": best["offered_erlangs"],
            "metrics": best["metrics"], "failing_scale": hi, "probes": probes}


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): a 95 % Student-t interval of the mean (a point with one value)."""
    n = len(xs)
    mean = sum(xs) / n
    if n < 2:
        return mean, mean, mean
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = (T95[n - 2] if n - 1 <= len(T95) else 1.96) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m sim.slo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", required=True, metavar="SPEC",
                    help="a generator spec (its rate scales) or a CSV/JSONL file (its arrival "
                         "times compress)")
    ap.add_argument("--slo", nargs="+", required=True, metavar="KEY=VALUE")
    ap.add_argument("--slots", type=int, required=True, help="the node's max sessions")
    ap.add_argument("--profile", choices=("reference", "dense"), default="reference")
    ap.add_argument("--context", type=int, default=1500)
    ap.add_argument("--cost-model", default=str(DEFAULT_PATH))
    ap.add_argument("--policy", nargs="+", metavar="WORD", default=["guarded"],
                    help="start policy (default: guarded, the node's)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0, help="the first seed")
    ap.add_argument("--snapshot-mb", type=float, default=-1.0,
                    help="prompt snapshots' memory, MB (-1: the executors' default, 0: none: "
                         "every start prefills its prompt)")
    ap.add_argument("--tolerance", type=float, default=0.02,
                    help="bisection stops when the bracket's ends are this close (relative)")
    ap.add_argument("--out", help="result JSON, or a folder for it (default: "
                                  "bench/results/slo-...json)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        slo = parse_slo(args.slo)
        if args.seeds < 1 or args.slots < 1 or not args.tolerance > 0:
            raise SloError("--seeds and --slots must be >= 1 and --tolerance > 0")
        policy = make_policy(args.policy)
        base = FastConfig(slots=args.slots,
                          workload=scaled(args.workload, 1.0, args.seed, slots=args.slots),
                          profile=args.profile, context=args.context,
                          cost_model=args.cost_model, policy=policy,
                          snapshot_mb=args.snapshot_mb)
        seeds = [args.seed + i for i in range(args.seeds)]
        found = []
        for seed in seeds:
            found.append(search(base, args.workload, slo, seed, args.tolerance))
            f = found[-1]
            print(f"seed {seed:4d}: scale {f['scale']:8.4f}  capacity {f['capacity_erlangs']:9.2f} "
                  f"Erlangs  ({len(f['probes'])} runs) {f['metrics']}", flush=True)
    except (SloError, WorkloadError, PolicyError, FastError, OSError) as exc:
        print(f"sim.slo: {exc}", file=sys.stderr)
        return 2
    mean, low, high = t_interval([f["capacity_erlangs"] for f in found])
    print(f"\ncapacity under {slo}: {mean:.2f} Erlangs, 95 % interval [{low:.2f}, {high:.2f}] "
          f"over {len(seeds)} seeds ({policy.name} policy, {args.slots} slots)")
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    result = {"slo": slo, "policy": policy.describe(), "workload": args.workload,
              "slots": args.slots, "profile": args.profile, "context": args.context,
              "snapshot_mb": args.snapshot_mb,
              "cost_model": args.cost_model, "seeds": seeds, "tolerance": args.tolerance,
              "capacity_erlangs": {"mean": round(mean, 3), "ci95": [round(low, 3),
                                                                     round(high, 3)]},
              "per_seed": found, **code_stamp(), "date": date,
              "command": "python -m sim.slo " + " ".join(sys.argv[1:] if argv is None else argv)}
    stamp = date.replace(":", "").replace("-", "")[:15]
    name = Path(args.workload.split(":")[0]).stem
    path = Path(args.out) if args.out else RESULTS
    if path.is_dir():                   # a folder: the result's own name inside it
        path = path / f"slo-{name}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
