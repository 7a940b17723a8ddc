"""`python -m sim.plot RESULT.json [RESULT.json ...] [--out DIR]`: figures of bench, simulator
and SLO-search results (`python -m wave_actors.bench`, `sim.run`, `sim.slo`), as PNGs.

For each bench or sim.run result (its first run unless `--run` says otherwise):
- `<name>-beats.png`: every measured beat's latency (release to outputs routed) against time,
  with the 160 ms deadline, and live sessions on a second axis: the sawtooth of calls under
  churn and the spikes of session starts;
- `<name>-opens.png`: the distribution of waits for `opened` (a CDF);
- `<name>-calls.png` (a result with per-call records): histograms of late beats per call and
  of each call's longest run of consecutive late beats.
With several of them, `compare.png`: their beat-latency CDFs on one axis, each labelled by its
file, for an A/B of two policies or settings.
With any result that has deadline metrics (every run of a `--workload` result; every probe of
a `sim.slo` result), `blocking.png`: blocking probability against offered Erlangs, one series
per start policy (its name and parameters), each point one run or probe. An SLO result has no
beat traces: it gets this figure only.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from wave_actors.core.frames import BEAT_MS, BEAT_S


def _plt():
    """pyplot, imported at the first figure: a second of import that the results' readers
    (and every test process that collects this module) do without."""
    import matplotlib
    matplotlib.use("Agg")           # files only: no display
    import matplotlib.pyplot as plt
    return plt


class PlotError(ValueError):
    pass


def load(path: str | Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise PlotError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        data = {}
    if is_slo(data):
        return data
    if not isinstance(data.get("per_run"), list) or not data["per_run"]:
        raise PlotError(f"{path}: not a bench, sim.run or sim.slo result (no per_run or "
                        f"per_seed)")
    return data


def is_slo(result: dict) -> bool:
    """A `sim.slo` result: probes of the load search, no runs and no traces."""
    return isinstance(result.get("per_seed"), list) and "per_run" not in result


def _run(result: dict, run: int) -> dict:
    runs = result["per_run"]
    if not 0 <= run < len(runs):
        raise PlotError(f"run {run + 1} asked for; the result has {len(runs)}")
    trace = runs[run].get("trace") or {}
    if not trace.get("latency_ms"):
        raise PlotError("the result has no per-beat trace")
    return runs[run]


def beats_figure(result: dict, run: int = 0, title: str = ""):
    r = _run(result, run)
    lat = np.asarray(r["trace"]["latency_ms"], float)
    t = np.arange(len(lat)) * BEAT_S
    fig, ax = _plt().subplots(figsize=(9, 4))
    ax.plot(t, lat, lw=0.8, color="tab:blue", label="beat latency")
    ax.axhline(BEAT_MS, color="tab:red", ls="--", lw=1, label=f"deadline ({BEAT_MS} ms)")
    ax.set_xlabel("time in the measured beats (s)")
    ax.set_ylabel("ms, release to outputs routed")
    live = r["trace"].get("sessions")
    if live:
        ax2 = ax.twinx()
        ax2.step(t[:len(live)], live, where="post", lw=0.8, color="tab:green",
                 label="live sessions")
        ax2.set_ylabel("live sessions")
        ax2.legend(loc="upper right")
    ax.legend(loc="upper left")
    ax.set_title(title or f"{result.get('backend')} {result.get('profile')}, "
                 f"{r['sessions']} sessions: {r['late_beats']} late of {r['beats']}")
    fig.tight_layout()
    return fig


def opens_figure(result: dict, run: int = 0, title: str = ""):
    r = _run(result, run)
    waits = np.sort(np.asarray(r.get("open_waits_ms") or [], float))
    fig, ax = _plt().subplots(figsize=(6, 4))
    if len(waits):
        ax.step(waits, np.arange(1, len(waits) + 1) / len(waits), where="post")
    else:
        ax.text(0.5, 0.5, "no open waits recorded", ha="center", transform=ax.transAxes)
    ax.set_xlabel("wait for `opened` (ms)")
    ax.set_ylabel("fraction of opens")
    ax.set_title(title or f"opens: {r.get('opens', len(waits))}, "
                 f"refused {r.get('refusals', 0)}")
    fig.tight_layout()
    return fig


def calls_figure(result: dict, run: int = 0, title: str = ""):
    """Two histograms over the opened calls: late beats each heard, and its longest run of
    late beats in a row (one audible gap; a run of n is n·160 ms of late audio)."""
    runs = result["per_run"]
    if not 0 <= run < len(runs):
        raise PlotError(f"run {run + 1} asked for; the result has {len(runs)}")
    opened = [c for c in runs[run].get("calls") or [] if not c.get("blocked")]
    fig, axes = _plt().subplots(1, 2, figsize=(9, 3.6))
    for ax, key, xlabel in ((axes[0], "late_beats", "late beats in the call"),
                            (axes[1], "longest_late_run", "longest run of late beats")):
        xs = np.asarray([c[key] for c in opened], int)
        top = int(xs.max()) if len(xs) else 0
        # one bar per integer value, so a bar's height is the calls with exactly that count
        ax.hist(xs, bins=np.arange(top + 2) - 0.5, color="tab:blue")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("calls")
        ax.set_yscale("symlog", linthresh=1)    # the zero bar dwarfs the rest
    blocked = sum(bool(c.get("blocked")) for c in runs[run].get("calls") or [])
    fig.suptitle(title or f"{len(opened)} calls opened, {blocked} blocked")
    fig.tight_layout()
    return fig


def policy_label(start: dict | None) -> str:
    """A start policy as a legend names it: its name, then its parameters."""
    if not start:
        return "policy not recorded"
    params = " ".join(f"{k}={v}" for k, v in sorted((start.get("params") or {}).items()))
    return f"{start.get('name', '?')} {params}".strip()


def blocking_points(result: dict) -> dict[str, list[tuple[float, float]]]:
    """(offered Erlangs, blocking) of each run with deadline metrics (or each probe of an SLO
    search), by start-policy label. A closed-loop run offers no load and is left out."""
    points: dict[str, list[tuple[float, float]]] = {}
    if is_slo(result):
        label = policy_label(result.get("policy"))
        for seed in result["per_seed"]:
            for p in seed.get("probes", []):
                # older searches recorded blocking only when an SLO was on it
                b = p.get("blocking", p.get("metrics", {}).get("blocking"))
                if b is not None:
                    points.setdefault(label, []).append((p["offered_erlangs"], b))
        return points
    for r in result["per_run"]:
        d = r.get("deadlines") or {}
        if d.get("offered_erlangs") is not None:
            label = policy_label((r.get("policies") or {}).get("start"))
            points.setdefault(label, []).append((d["offered_erlangs"], d["blocking"]))
    return points


def slots_of(result: dict) -> int | None:
    return result.get("slots") or (result.get("extra") or {}).get("slots")


def blocking_figure(results: dict[str, dict]):
    series: dict[str, list[tuple[float, float]]] = {}
    for result in results.values():
        for label, pts in blocking_points(result).items():
            series.setdefault(label, []).extend(pts)
    if not series:
        raise PlotError("no result has deadline metrics with an offered load")
    fig, ax = _plt().subplots(figsize=(7, 4))
    for label, pts in series.items():
        x, y = zip(*sorted(pts))
        ax.plot(x, y, marker="o", lw=1, label=label)
    slots = {slots_of(r) for r in results.values()} - {None}
    if len(slots) == 1:
        # Offered load is a mean over the arrivals' span: past the slots, calls must block
        ax.axvline(slots.pop(), color="grey", ls=":", lw=1, label="node slots")
    ax.set_xlabel("offered load (Erlangs)")
    ax.set_ylabel("blocking probability")
    ax.set_ylim(bottom=0)           # two close points must not read as far apart
    ax.legend()
    fig.tight_layout()
    return fig


def compare_figure(results: dict[str, dict], run: int = 0):
    fig, ax = _plt().subplots(figsize=(7, 4))
    for name, result in results.items():
        lat = np.sort(np.asarray(_run(result, run)["trace"]["latency_ms"], float))
        ax.step(lat, np.arange(1, len(lat) + 1) / len(lat), where="post", label=name)
    ax.axvline(BEAT_MS, color="tab:red", ls="--", lw=1, label="deadline")
    ax.set_xlabel("beat latency (ms)")
    ax.set_ylabel("fraction of beats")
    ax.legend()
    fig.tight_layout()
    return fig


def names(paths: list[str]) -> list[str]:
    """A name a result file: its stem, with its folder's name in front where two stems are
    the same (two runs in one second write the same stem to different folders), and a
    number after where that is not enough either."""
    stems = [Path(p).stem for p in paths]
    out = [f"{Path(p).parent.name}-{stem}" if stems.count(stem) > 1 else stem
           for p, stem in zip(paths, stems)]
    return [f"{n}-{i + 1}" if out.count(n) > 1 else n for i, n in enumerate(out)]


def figures(results: dict[str, dict], run: int):
    """(file name, figure) of every figure the results make, built one at a time."""
    runs = {name: r for name, r in results.items() if not is_slo(r)}
    for name, result in runs.items():
        yield f"{name}-beats.png", beats_figure(result, run)
        yield f"{name}-opens.png", opens_figure(result, run)
        if result["per_run"][min(run, len(result["per_run"]) - 1)].get("calls"):
            yield f"{name}-calls.png", calls_figure(result, run)
    if len(runs) > 1:
        yield "compare.png", compare_figure(runs, run)
    if any(blocking_points(r) for r in results.values()):
        yield "blocking.png", blocking_figure(results)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.plot", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="result JSON files")
    ap.add_argument("--out", default=".", help="directory for the PNGs")
    ap.add_argument("--run", type=int, default=1, help="which run of each result (1: the first)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    written = []
    try:
        results = {name: load(p) for name, p in zip(names(args.results), args.results)}
        out.mkdir(parents=True, exist_ok=True)
        for file, fig in figures(results, args.run - 1):
            fig.savefig(out / file, dpi=110)
            _plt().close(fig)
            written.append(out / file)
    except (PlotError, OSError) as exc:
        print(f"sim.plot: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
