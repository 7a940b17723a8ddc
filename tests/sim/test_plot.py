"""`python -m sim.plot`: figures of real `sim.run` results.

Bugs caught: a beat figure drawn from other numbers than the result's trace (or its live
sessions shifted against time), an open-wait CDF not over the result's own waits, a missing
compare figure for an A/B (two results of one file name, from two folders, taken for one),
and a bad file ending in a traceback instead of one line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sim import plot, run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for policy in ("eager", "budgeted"):
        d = tmp_path_factory.mktemp(policy)
        assert run.main(["--sessions", "10", "--beats", "60", "--churn", "2", "--policy", policy,
                         "--out", str(d)]) == 0
        (out[policy],) = d.glob("*.json")
    return out


def test_results_of_the_same_name_keep_apart():
    """Two runs in one second write one file name to two folders: both are plotted."""
    assert plot.names(["a/x.json", "b/x.json", "c/y.json"]) == ["a-x", "b-x", "y"]
    assert plot.names(["a/x.json", "a/x.json"]) == ["a-x-1", "a-x-2"]


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


def test_the_command_writes_pngs_and_a_comparison(results, tmp_path):
    cmd = [sys.executable, "-m", "sim.plot", *map(str, results.values()), "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in tmp_path.glob("*.png"))
    assert "compare.png" in names and len(names) == 5
    for p in tmp_path.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not": "a result"}))
    done = subprocess.run([sys.executable, "-m", "sim.plot", str(bad), "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "per_run" in done.stderr
