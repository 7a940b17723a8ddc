"""`python -m sim.validate <GPU result JSON…> [--cost-model F] [--seeds K] [--draws M]
[--json OUT]`: does the simulator reproduce what the GPU measured?

For each GPU bench result it reads the workload (profile, context, sessions, beats, runs,
churn, burst, `--workload`, start policy, seed, clock-policy flags, snapshot memory: from the
result's `command`, its fields overriding), runs the same workload through the production node
on virtual time with the sim backend and a fitted cost model
(`sim/costmodel_<gpu>_<profile>.json` by default, see `sim.fit`), and prints both side by side:
p50/p99 beat latency, late beats, open wait p50/p99, refusals, with the differences. A file
PASSes when the sim's p50 and p99 are within 10 % of the GPU's, its open-wait p99 within 10 %
or one beat (160 ms: opens are answered at beats), whichever is more, and the GPU's rates of
late beats (of its beats) and of refusals (of its tries) each lie in the sim runs' interval
(below); the exit status is 1 if any file FAILs, 2 on input it cannot use. Runs the cost
model was fitted on are counted apart from held-out ones: only those test the model. The sim's own results go to a temporary folder, never bench/results/.

A replay runs the node the GPU run had: its recorded start policy (a result that recorded none
ran `eager`, the node's default then), no prompt snapshots where the result's engine kept none
(`extra.engine.snapshots` absent: recorded before snapshots existed; `--snapshot-mb 0`), and
the batch buckets its engine captured (`extra.engine.buckets_captured`, into the cost model's
`buckets`: an engine before the ladder captured only its top bucket, and a device short of
memory stops the ladder early, so a beat of few sessions replays a large bucket).
What is compared is what the GPU result counted: a result with `measured` (the bench's headline
counts every beat from the first open to the last close, `results.WINDOW_OF`) against the
replay's headline, one without (recorded before that: its headline was the measured window)
against the replay's measured window (`measured`), in the full node and the draws alike.

One GPU run is one draw of its beats' jitter; so is one sim run. A rare event (one refused
open in 500 under an admission policy at its threshold) comes or not by chance on either
side. `--seeds K` runs the sim K times (the GPU run's seed, then seeds past its runs' draws):
the sim's numbers are their mean (each seed's shown too). `--draws M` (default 100) replays
the workload M more times in the fast mode (`sim.fast.fast`: the same node's book, policy and
cost model, frames as counters; a run in well under a second), for the rates alone: a few
runs cannot tell a 30 % event from none. A rate agrees when the GPU's lies in the central
1 − ALPHA (95 %) of the sim runs' rates, seeds and draws together; with fewer than FEW_RUNS
runs, whose spread says nothing (one run's range is a point), the GPU's count of its tries or
beats against the runs' pooled counts by Fisher's exact test at ALPHA. So a GPU run that refused where the sim refuses in 28 % of its runs
passes only if it refused about as often as those runs did, and one that did not refuse
fails where the sim refuses in more than 97.5 % of them. A run whose flags the draws do not
replay (a burst, a workload, clock-policy or start-row flags) is judged on its seeds alone,
and says so.

Which GPU results to validate against: those measured on the serving code the sim models (a
result's `commit` says which); a run from before a change to the beat or the host's loop says
nothing of today's code.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import shlex
import sys
import tempfile
from pathlib import Path

import numpy as np

from sim.fast.fast import FastConfig, FastError
from sim.fast.run import run_fast
from sim.measured import FitError, gpu_result
from sim.verdicts import (ALPHA, TOLERANCE, VERDICTS, ValidateError, compare, held_apart,
                          metrics)
from wave_actors.core.policy_spec import PolicyError, make_policy

DRAWS = 100              # fast-mode replays a file for the verdicts (module doc)
FAST_KEYS = {"profile", "context", "sessions", "beats", "runs", "churn", "seed", "policy",
             "snapshot_mb", "no_warm"}
SIM_DIR = Path(__file__).resolve().parent


def _workload_parser() -> argparse.ArgumentParser:
    """The bench flags that shape the workload; every other flag (the backend, its workers,
    its polling) is the GPU's own and does not carry over to the sim."""
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag, kind in (("--profile", str), ("--context", int), ("--sessions", int),
                       ("--beats", int), ("--runs", int), ("--churn", float), ("--burst", int),
                       ("--seed", int), ("--start-rows", int), ("--warmup-max", int),
                       ("--max-sessions", int), ("--release-hold-ms", float),
                       ("--output-slice", int), ("--frames-every-ms", float),
                       ("--snapshot-mb", float)):
        ap.add_argument(flag, type=kind)
    ap.add_argument("--hold-inputs", action="store_true")
    ap.add_argument("--no-warm", action="store_true")
    ap.add_argument("--policy", nargs="+")
    ap.add_argument("--workload")
    return ap


def workload(raw: dict) -> dict:
    """The workload of a bench result: its command's flags, its fields where it has them; the
    start policy it recorded (none recorded: `eager`, the node's default then), and no prompt
    snapshots where its engine kept none (module doc)."""
    words = shlex.split(raw.get("command") or "")
    flags, _ = _workload_parser().parse_known_args(words)
    got = {k: v for k, v in vars(flags).items() if v not in (None, False)}
    got.update({k: raw[k] for k in ("profile", "context", "sessions", "beats", "runs")
                if raw.get(k) is not None})
    extra = raw.get("extra") or {}
    seeds = extra.get("seeds")
    if seeds:
        got["seed"] = seeds[0]
    start = (raw.get("policy") or {}).get("start")
    if "policy" not in got:
        got["policy"] = ([start["class"]] + [f"{k}={v}" for k, v in start["params"].items()]
                         if start and start.get("class") else ["eager"])
    if "snapshot_mb" not in got and "snapshots" not in (extra.get("engine") or {}):
        got["snapshot_mb"] = 0.0                    # before prompt snapshots: none kept
    if not ((raw.get("per_run") or [{}])[0].get("snapshots") or {}).get("warm"):
        got["no_warm"] = True                       # its node made no snapshot before the run
    return got


def window(raw: dict) -> str:
    """Which beats a GPU result's headline counts: "all" (first open to last close, as the
    bench counts since it records `measured`), else "measured" (the --beats window)."""
    runs = raw.get("per_run") or [{}]
    return "all" if "measured" in raw or "windows" in runs[0] else "measured"


def sim_argv(work: dict, cost_model: str, out: str) -> list[str]:
    argv = ["--backend", "sim", "--virtual", "--cost-model", cost_model, "--out", out]
    for key, value in work.items():
        flag = "--" + key.replace("_", "-")
        if key == "policy":
            argv += [flag, *value]
        elif value is True:
            argv.append(flag)
        else:
            argv += [flag, str(value)]
    return argv


def read_gpu(path: str) -> dict:
    try:
        return gpu_result(path)
    except FitError as exc:
        raise ValidateError(str(exc)) from None


def default_model(raw: dict) -> Path:
    gpu = str(raw.get("gpu") or "none").split()[-1].lower()
    return SIM_DIR / f"costmodel_{gpu}_{raw['profile']}.json"


def run_sim(argv: list[str], out_dir: Path) -> dict:
    """The bench on the sim backend, in this process; its chatter is kept unless it fails."""
    from wave_actors.bench import cli
    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter):
            cli.main(argv, "python -m wave_actors.bench " + " ".join(argv))
    except (Exception, SystemExit) as exc:
        tail = " | ".join(chatter.getvalue().strip().splitlines()[-3:])
        raise ValidateError(f"the sim run failed ({exc!r}): {tail}") from None
    written = sorted(out_dir.glob("*.json"), key=lambda p: p.stat().st_mtime)
    if not written:
        raise ValidateError(f"the sim run wrote no result under {out_dir}")
    return json.loads(written[-1].read_text())


def seeds_for(work: dict, k: int) -> list[int]:
    """The GPU run's seed, then seeds whose runs draw apart from its (run r draws seed + r)."""
    first, runs = int(work.get("seed", 0)), max(1, int(work.get("runs", 1)))
    return [first + i * runs for i in range(k)]


def fast_draws(work: dict, model: Path, seeds: list[int],
               beats: str = "all") -> list[dict] | None:
    """The workload in the fast mode, a run a seed: each run's compared numbers (`beats`: as
    `metrics`); None when the workload has a flag the fast mode does not model."""
    if set(work) - FAST_KEYS:
        return None
    try:
        cfg = FastConfig(slots=int(work["sessions"]), lines=int(work["sessions"]),
                         churn_s=float(work.get("churn", 0.0)), beats=int(work["beats"]),
                         profile=work["profile"], context=int(work["context"]),
                         cost_model=str(model), runs=int(work.get("runs", 1)),
                         policy=make_policy(work["policy"]) if "policy" in work else None,
                         snapshot_mb=float(work.get("snapshot_mb", -1.0)),
                         warm=not work.get("no_warm", False))
        out = [metrics(dataclasses.asdict(run_fast(dataclasses.replace(cfg, seed=seed))), beats)
               for seed in seeds]           # each run copies the policy afresh
    except (FastError, PolicyError) as exc:
        raise ValidateError(f"the fast-mode draws failed: {exc}") from None
    return out


def captured(raw: dict) -> list[int]:
    """The batch buckets the GPU run's engine captured (empty: not recorded)."""
    extra = raw.get("extra") or {}
    for key in ("engine_after", "engine"):
        got = (extra.get(key) or {}).get("buckets_captured")
        if got:
            return sorted(int(b) for b in got)
    return []


def with_buckets(model: Path, buckets: list[int], folder: Path) -> Path:
    """`model` with the GPU run's captured buckets (a copy in `folder`; `model` itself when
    none were recorded or the model names its own)."""
    doc = json.loads(model.read_text())
    if not buckets or doc.get("buckets"):
        return model
    out = folder / model.name
    out.write_text(json.dumps({**doc, "buckets": buckets}))
    return out


def validate_one(path: str, cost_model: str | None, seeds: int = 1,
                 draws: int = DRAWS) -> dict:
    raw = read_gpu(path)
    named = Path(cost_model) if cost_model else default_model(raw)
    if not named.is_file():
        raise ValidateError(f"{path}: no cost model {named} (fit one with python -m sim.fit)")
    with tempfile.TemporaryDirectory(prefix="sim-validate-model-") as folder:
        return _validate(path, raw, named, with_buckets(named, captured(raw), Path(folder)),
                         seeds, draws)


def _validate(path: str, raw: dict, named: Path, model: Path, seeds: int,
              draws: int) -> dict:
    fitted_from = {s["file"] for s in json.loads(named.read_text()).get("_fitted_from", [])}
    work = workload(raw)
    sims, commands = [], []
    for seed in seeds_for(work, seeds):
        with tempfile.TemporaryDirectory(prefix="sim-validate-") as tmp:
            argv = sim_argv({**work, "seed": seed}, str(model), tmp)
            sims.append(run_sim(argv, Path(tmp)))
        commands.append("python -m wave_actors.bench " + " ".join(
            {tmp: "<tmp>", str(model): str(named)}.get(a, a) for a in argv))
    beats = window(raw)
    fast = (fast_draws(work, model, seeds_for(work, seeds + draws)[seeds:], beats) if draws
            else None)
    got = compare(metrics(raw), [metrics(s, beats) for s in sims], draws=fast)
    full = f"{seeds} full-node run{'s' if seeds > 1 else ''}"
    how = (f"{full} and {draws} fast-mode runs" if fast
           else full + (f" alone: the draws do not replay {sorted(set(work) - FAST_KEYS)}"
                        if draws else ""))
    buckets = json.loads(model.read_text()).get("buckets") or []
    return {"file": Path(path).name, "commit": raw.get("commit"), "backend": raw["backend"],
            "cost_model": named.name, "buckets": buckets,
            "held_out": Path(path).name not in fitted_from,
            "sim_command": commands[0], **({"sim_commands": commands} if seeds > 1 else {}),
            "sim_commit": sims[0].get("commit"), "verdicts_from": how,
            "beats_compared": ("every beat, first open to last close" if beats == "all" else
                               "the measured window (the GPU result counted no other)"),
            **got}


def table(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        lines.append(f"{r['file']} ({r['backend']} at {r['commit']}, "
                     f"{'held out' if r['held_out'] else 'fitted on'}; {r['cost_model']}"
                     + (f" with the GPU's buckets {r['buckets']}" if r.get("buckets") else "")
                     + f"; {r['beats_compared']})")
        seeds = "sim by seed" if "sim_seeds" in r["metrics"]["p50_ms"] else ""
        lines.append(f"  {'':12} {'GPU':>9} {'sim':>9} {'diff':>9} {'diff %':>8}  {seeds}")
        for key, m in r["metrics"].items():
            each = " ".join(f"{v:.1f}" for v in m.get("sim_seeds", ()))
            lines.append(f"  {key:12} {m['gpu']:9.1f} {m['sim']:9.1f} {m['diff']:+9.1f} "
                         f"{m['diff_pct']:+8.1f}  {each}".rstrip())
        v = r.get("verdicts")
        if v:
            lines.append("  sim runs with some " + ", ".join(
                f"{what}: {v[key]['with_some']} of {v[key]['runs']}" for key, _, what in VERDICTS)
                + f" ({r['verdicts_from']})")
        lines.append(f"  {r['verdict']}" + (": " + "; ".join(r["why"]) if r["why"] else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.validate", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("files", nargs="+", help="GPU bench result JSONs")
    ap.add_argument("--cost-model", help="default: sim/costmodel_<gpu>_<profile>.json")
    ap.add_argument("--seeds", type=int, default=1,
                    help="sim runs a file (their mean compared; a verdict agrees when some "
                         "seed's does; default 1)")
    ap.add_argument("--draws", type=int, default=DRAWS,
                    help=f"fast-mode runs a file for the late/refusal verdicts (module doc; "
                         f"default {DRAWS}, 0: the seeds alone)")
    ap.add_argument("--json", metavar="OUT", help="write the comparison here")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.draws < 0:
        print("sim.validate: --seeds must be 1 or more, --draws 0 or more", file=sys.stderr)
        return 2
    rows = []
    try:
        for path in args.files:
            rows.append(validate_one(path, args.cost_model, args.seeds, args.draws))
            print(table(rows[-1:]), flush=True)
    except ValidateError as exc:
        print(f"sim.validate: {exc}", file=sys.stderr)
        return 2
    failed = [r["file"] for r in rows if r["verdict"] == "FAIL"]
    groups = held_apart(rows)
    for name, g in groups.items():
        if g["files"]:
            print(f"{name}: {g['pass']} of {g['files']} PASS")
    print(f"\n{len(rows) - len(failed)} of {len(rows)} PASS" + (f"; FAIL: {failed}" if failed
                                                              else ""))
    if args.json:
        doc = {"_note": __doc__.split("\n\n")[-1].strip(), "tolerance": TOLERANCE,
               "seeds": args.seeds, "draws": args.draws, "alpha": ALPHA,
               "all_pass": not failed, "held_apart": groups, "files": rows,
               "max_abs_diff_pct": {k: float(np.max([abs(r["metrics"][k]["diff_pct"])
                                                      for r in rows]))
                                    for k in ("p50_ms", "p99_ms")}}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"written: {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
