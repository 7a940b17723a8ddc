"""`python -m sim.plot RESULT.json [RESULT.json ...] [--out DIR]`: figures of bench and
simulator results (`wave_actors.bench`, `sim.run`), as PNGs.

For each result (its first run unless `--run` says otherwise):
- `<name>-beats.png`: every measured beat's latency (release to outputs routed) against time,
  with the 160 ms deadline, and live sessions on a second axis: the sawtooth of calls under
  churn and the spikes of session starts;
- `<name>-opens.png`: the distribution of waits for `opened` (a CDF).
With several results, `compare.png`: their beat-latency CDFs on one axis, each labelled by its
file, for an A/B of two policies or settings.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")           # files only: no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from wave_actors.core.frames import BEAT_MS, BEAT_S  # noqa: E402


class PlotError(ValueError):
    pass


def load(path: str | Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise PlotError(f"{path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("per_run"), list) \
            or not data["per_run"]:
        raise PlotError(f"{path}: not a bench or sim.run result (no per_run)")
    return data


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
    fig, ax = plt.subplots(figsize=(9, 4))
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
    fig, ax = plt.subplots(figsize=(6, 4))
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


def compare_figure(results: dict[str, dict], run: int = 0):
    fig, ax = plt.subplots(figsize=(7, 4))
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.plot", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="result JSON files")
    ap.add_argument("--out", default=".", help="directory for the PNGs")
    ap.add_argument("--run", type=int, default=1, help="which run of each result (1: the first)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    try:
        results = {name: load(p) for name, p in zip(names(args.results), args.results)}
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for name, result in results.items():
            for kind, make in (("beats", beats_figure), ("opens", opens_figure)):
                fig = make(result, args.run - 1)
                path = out / f"{name}-{kind}.png"
                fig.savefig(path, dpi=110)
                plt.close(fig)
                written.append(path)
        if len(results) > 1:
            fig = compare_figure(results, args.run - 1)
            written.append(out / "compare.png")
            fig.savefig(written[-1], dpi=110)
            plt.close(fig)
    except (PlotError, OSError) as exc:
        print(f"sim.plot: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
