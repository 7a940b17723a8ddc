"""`python -m sim.run`: the production node, clock and scheduler on virtual time with the sim
backend, for scheduling research. It is the capacity benchmark in virtual mode with the knobs a
researcher turns: the cost model (a JSON file, or the roofline defaults with a relative jitter),
the profile, the context, and the number of sessions.

    python -m sim.run --sessions 96 --beats 500 --jitter 0.05
    python -m sim.run --find-max --profile dense --cost-model my-fit.json
    python -m sim.run --sessions 280 --profile dense --cost-model sim/costmodel_h200_dense.json --churn 60
    python -m sim.run --sessions 280 --churn 60 --policy eager
    python -m sim.run --sessions 280 --churn 60 --policy budgeted margin_s=0.004 max_hold=6
    python -m sim.run --sessions 300 --workload diurnal:peak=3,duration=1200 --policy forecast
    python -m sim.run --sessions 300 --workload calls.csv --fast

`--workload` replaces the steady callers with calls from a file or a seeded generator
(`wave_actors/bench/workload.py`); `--sessions` is then the node's slots, the run lasts until the
last call ends, and the result has every call's record and the deadline metrics. `--fast` runs the
beat-level mode (`sim/fast/fast.py`: the same slot book, policies and cost model, frames as
counters) instead of the full node: far faster, checked against the full node by its tests.

`--policy` names the start policy (a built-in's short name, or module:Class of one's own,
then key=value parameters); the result JSON records it under `policy`.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from sim.costmodel import DEFAULT_PATH
from wave_actors.bench import cli, results


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sim.run", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--beats", type=int, default=200)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--context", type=int, default=1500)
    ap.add_argument("--profile", choices=("reference", "dense"), default="reference")
    ap.add_argument("--cost-model", help="JSON of cost-model parameters (default: the roofline)")
    ap.add_argument("--jitter", type=float, help="relative std of each beat's modelled time")
    ap.add_argument("--churn", type=float, default=0.0, metavar="SECONDS",
                    help="mean call length: calls end and new ones start through the run, so "
                         "session starts compete with live beats (default 0: no churn)")
    ap.add_argument("--policy", nargs="+", metavar="WORD",
                    help="start policy: eager | budgeted | headroom | forecast | "
                         "module:Class, then key=value ...")
    ap.add_argument("--workload", metavar="SPEC",
                    help="calls from a .csv/.jsonl file or a generator: poisson | diurnal | "
                         "bursty | flash | retry, e.g. poisson:rate=2,duration=600,call=90")
    ap.add_argument("--fast", action="store_true",
                    help="the beat-level mode (sim/fast/fast.py) instead of the full node")
    ap.add_argument("--snapshot-mb", type=float, default=-1.0,
                    help="prompt snapshots' memory, MB (-1: the graph executor's 500, 0: none: "
                         "every start prefills its prompt)")
    ap.add_argument("--seed", type=int, default=0,
                    help="every random choice: the workload, callers, the cost model's jitter")
    ap.add_argument("--find-max", action="store_true")
    ap.add_argument("--out", default=str(results.RESULTS))
    return ap


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    cost = args.cost_model or str(DEFAULT_PATH)
    if args.jitter is not None:
        if args.jitter < 0:
            ap.error("--jitter must be >= 0")
        raw = json.loads(Path(cost).read_text())
        raw["jitter_rel"] = args.jitter
        tmp = Path(tempfile.mkdtemp()) / "costmodel.json"
        tmp.write_text(json.dumps(raw))
        cost = str(tmp)
    command = "python -m sim.run " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.fast:
        if args.find_max:
            ap.error("--fast has no --find-max: `python -m sim.slo` searches capacity")
        from sim.fast import run as fast_run
        fwd = ["--slots", str(args.sessions), "--beats", str(0 if args.workload else args.beats),
               "--runs", str(args.runs), "--context", str(args.context), "--profile",
               args.profile, "--cost-model", cost, "--out", args.out, "--seed", str(args.seed)]
        fwd += (["--workload", args.workload] if args.workload
                else ["--lines", str(args.sessions), "--churn", str(args.churn)])
        if args.policy:
            fwd += ["--policy", *args.policy]
        if args.snapshot_mb != -1.0:
            fwd += ["--snapshot-mb", str(args.snapshot_mb)]
        return fast_run.main(fwd, command)
    forwarded = ["--backend", "sim", "--virtual", "--sessions", str(args.sessions), "--beats",
                 str(args.beats), "--runs", str(args.runs), "--context", str(args.context),
                 "--profile", args.profile, "--cost-model", cost, "--out", args.out,
                 "--snapshot-mb", str(args.snapshot_mb)]
    if args.workload:
        forwarded += ["--workload", args.workload]
    if args.churn:
        forwarded += ["--churn", str(args.churn)]
    if args.policy:
        forwarded += ["--policy", *args.policy]
    forwarded += ["--seed", str(args.seed)]
    if args.find_max:
        forwarded.append("--find-max")
    return cli.main(forwarded, command)


if __name__ == "__main__":
    sys.exit(main())
