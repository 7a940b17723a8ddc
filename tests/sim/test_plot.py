"""`python -m sim.plot`: figures of real `sim.run` and `sim.slo` results.

Bugs caught: a beat figure drawn from other numbers than the result's trace (or its live
sessions shifted against time), an open-wait CDF not over the result's own waits, a missing
compare figure for an A/B (two results of one file name, from two folders, taken for one),
a blocking curve not of the runs' own (offered, blocking) points or with two policies in one
series, an SLO search refused or drawn with beat figures it has no trace for, per-call
histograms not of the calls' own counts, and a bad file ending in a traceback instead of one
line."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from sim import plot, run, slo

ROOT = Path(__file__).resolve().parents[2]


def near_deadline() -> str:
    """The dense H200 model with every beat at its 290-session point (135.4 ms, whatever the
    bucket): a small node whose beats come near the deadline, as the H200's at 290."""
    raw = json.loads((ROOT / "sim/costmodel_h200_dense.json").read_text())
    raw["beat_points"] = [[1, 0.1353907], [512, 0.1353907]]
    path = Path(tempfile.mkdtemp(prefix="near-deadline-")) / "costmodel.json"
    path.write_text(json.dumps(raw))
    return str(path)


# Small enough to run in a second; beats near the deadline, and 16 slots under 1.5 calls a
# second both block and (forecast's admission) refuse. Without prompt snapshots: the calls
# share one prompt, and with them every start after the first is a copy and no beat runs late.
DENSE = ["--profile", "dense", "--cost-model", near_deadline(), "--snapshot-mb", "0"]
WORKLOAD = "poisson:rate=1.5,duration=60,call=15"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for policy in ("eager", "budgeted"):
        d = tmp_path_factory.mktemp(policy)
        assert run.main(["--sessions", "10", "--beats", "60", "--churn", "2", "--policy", policy,
                         "--out", str(d)]) == 0
        (out[policy],) = d.glob("*.json")
    return out


@pytest.fixture(scope="module")
def workload_results(tmp_path_factory) -> dict[str, Path]:
    """Fast-mode workload runs of two policies, two runs each (run r draws seed + r, so each
    run offers its own load)."""
    out = {}
    for policy in ("eager", "forecast"):
        d = tmp_path_factory.mktemp(policy)
        assert run.main(["--fast", "--sessions", "16", *DENSE, "--workload", WORKLOAD,
                         "--runs", "2", "--seed", "3", "--policy", policy,
                         "--out", str(d)]) == 0
        (out[policy],) = d.glob("*.json")
    return out


@pytest.fixture(scope="module")
def slo_result(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("slo") / "slo.json"
    assert slo.main(["--workload", WORKLOAD, "--slots", "16", *DENSE, "--slo", "late=0",
                     "--seeds", "1", "--policy", "budgeted", "max_hold=3",
                     "--out", str(path)]) == 0
    return path


def series(fig) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {line.get_label(): (np.asarray(line.get_xdata(), float),
                               np.asarray(line.get_ydata(), float))
            for line in fig.axes[0].lines}


def test_results_of_the_same_name_keep_apart():
    """Two runs in one second write one file name to two folders: both are plotted."""
    assert plot.names(["a/x.json", "b/x.json", "c/y.json"]) == ["a-x", "b-x", "y"]
    assert plot.names(["a/x.json", "a/x.json"]) == ["a-x-1", "a-x-2"]


@pytest.mark.slow
def test_the_figures_draw_the_results_own_numbers(results):
    data = plot.load(results["eager"])
    r = data["per_run"][0]
    fig = plot.beats_figure(data)
    lat, deadline = fig.axes[0].lines[:2]
    assert np.allclose(lat.get_ydata(), r["trace"]["latency_ms"])
    assert np.allclose(lat.get_xdata(), np.arange(len(r["trace"]["latency_ms"])) * 0.16)
    assert set(deadline.get_ydata()) == {160}
    assert np.allclose(fig.axes[1].lines[0].get_ydata(), r["trace"]["sessions"])
    waits = r["open_waits_ms"]
    assert len(waits) == r["opens"] > 10                 # churn: more opens than lines
    cdf = plot.opens_figure(data).axes[0].lines[0]
    assert np.allclose(cdf.get_xdata(), sorted(waits))
    assert cdf.get_ydata()[-1] == 1.0


@pytest.mark.slow
def test_the_command_writes_pngs_and_a_comparison(results, tmp_path):
    cmd = [sys.executable, "-m", "sim.plot", *map(str, results.values()), "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in tmp_path.glob("*.png"))
    # beats, opens and calls of each (the bench records closed-loop calls too), a comparison;
    # no blocking: a closed loop offers no load
    assert "compare.png" in names and "blocking.png" not in names and len(names) == 7
    for p in tmp_path.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not": "a result"}))
    done = subprocess.run([sys.executable, "-m", "sim.plot", str(bad), "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "per_run" in done.stderr


@pytest.mark.slow
def test_blocking_is_drawn_against_offered_load_one_series_per_policy(workload_results):
    data = {name: plot.load(path) for name, path in workload_results.items()}
    drawn = series(plot.blocking_figure(data))
    assert set(drawn) == {"eager", "forecast margin_s=0.008 max_hold=6 smoothing=0.3",
                          "node slots"}
    for name, result in data.items():
        (label,) = plot.blocking_points(result)
        x, y = drawn[label]
        runs = sorted((r["deadlines"]["offered_erlangs"], r["deadlines"]["blocking"])
                      for r in result["per_run"])
        assert len(runs) == 2 and runs[0][0] != runs[1][0]      # each run its own load
        assert np.allclose(x, [r[0] for r in runs]) and np.allclose(y, [r[1] for r in runs])
    assert set(drawn["node slots"][0]) == {16}


@pytest.mark.slow
def test_an_slo_search_draws_its_probes_as_a_blocking_curve(slo_result, tmp_path):
    data = plot.load(slo_result)
    probes = sorted((p["offered_erlangs"], p["blocking"])
                    for s in data["per_seed"] for p in s["probes"])
    assert len(probes) > 3 and len({b for _, b in probes}) > 1     # a curve, not a point
    (label,) = [k for k in series(plot.blocking_figure({"s": data})) if k != "node slots"]
    assert label == "budgeted margin_s=0.008 max_hold=3 smoothing=0.3"
    x, y = series(plot.blocking_figure({"s": data}))[label]
    assert np.allclose(x, [p[0] for p in probes]) and np.allclose(y, [p[1] for p in probes])
    done = subprocess.run([sys.executable, "-m", "sim.plot", str(slo_result), "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in tmp_path.glob("*.png")] == ["blocking.png"]   # no trace: no beats


@pytest.mark.slow
def test_the_calls_figure_counts_each_calls_late_beats(workload_results):
    data = plot.load(workload_results["forecast"])
    lates = [sum(c["late_beats"] for c in r["calls"]) for r in data["per_run"]]
    i = int(np.argmax(lates))                    # a run whose calls heard late beats
    opened = [c for c in data["per_run"][i]["calls"] if not c["blocked"]]
    fig = plot.calls_figure(data, i)
    for ax, key in zip(fig.axes, ("late_beats", "longest_late_run")):
        heights = [p.get_height() for p in ax.patches]
        assert heights == np.bincount([c[key] for c in opened]).tolist()
    assert sum(c["late_beats"] for c in opened) > 0      # the bars past zero are drawn too


@pytest.mark.slow
def test_workload_results_get_calls_and_blocking_figures(workload_results, slo_result,
                                                          tmp_path):
    paths = [*map(str, workload_results.values()), str(slo_result)]
    done = subprocess.run([sys.executable, "-m", "sim.plot", *paths, "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in tmp_path.glob("*.png"))
    assert "blocking.png" in names and "compare.png" in names
    assert sum(n.endswith("-calls.png") for n in names) == 2 and len(names) == 8
