"""The roll path's first use: the graph executor's first beat that rolls a context runs it cold
(measured on the H200: +5 to +11 ms, once a process). The cost model adds `first_roll_s` to
that beat alone, the sim executor and the fast mode alike, and `sim.fit` recovers it."""
import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sim import fit
from sim.costmodel import CostModel
from sim.fast.fast import FastConfig
from sim.fast.run import run_fast
from tests.sim.fit_kit import ROLL_S, carried_json
from wave_actors.bench import cli

ROOT = Path(__file__).resolve().parents[2]
FIRST_S = 0.05          # far above any other part of a beat: the beat that carries it stands out


def test_the_first_roll_costs_once_and_only_in_a_beat_without_start_rows():
    """Catches the cost added to every rolling beat (each roll then counted as a first), or to a
    first roll beside start rows (measured to hide there, within the rows' spread)."""
    model = replace(CostModel.load(ROOT / "sim" / "costmodel_h200_dense.json", "dense"),
                    residuals=(), row_residuals=(), host_s=(), first_roll_s=FIRST_S)
    draw = lambda rows, rolls, first: model.draw_parts(290, 1500, rows, 16 if rows else 0, 16,
                                                        random.Random(0), rolls=rolls,
                                                        first_roll=first)[0]
    assert draw(0, 4, True) - draw(0, 4, False) == pytest.approx(FIRST_S)
    assert draw(0, 0, True) == draw(0, 0, False)              # no roll in the beat: nothing
    assert draw(16, 4, True) == draw(16, 4, False)


def _cost_model(tmp_path: Path) -> str:
    """The dense model without jitter or host time, whose first roll costs FIRST_S."""
    raw = json.loads((ROOT / "sim" / "costmodel_h200_dense.json").read_text())
    raw.update(residuals=[], row_residuals=[], host_s=[], first_roll_s=FIRST_S)
    path = tmp_path / "costmodel.json"
    path.write_text(json.dumps(raw))
    return str(path)


def _slow_beats(trace: dict) -> list[int]:
    """The beats whose executor time is FIRST_S over the others like them."""
    rows, rolls = np.array(trace["rows"]), np.array(trace["rolls"])
    compute = np.array(trace["compute_ms"])
    plain = compute[(rows == 0) & (rolls == 0)]
    return [i for i, c in enumerate(compute)
            if rows[i] == 0 and c > np.median(plain) + 0.5e3 * FIRST_S]


@pytest.mark.slow
def test_the_sim_executor_and_the_fast_mode_slow_the_first_rolling_beat_alone(tmp_path):
    """Catches the executor forgetting it rolled before (every rolling beat slow), a flag reset
    per beat, or the fast mode and the full node disagreeing on which beat pays it."""
    cost = _cost_model(tmp_path)
    out = tmp_path / "full"
    assert cli.main(["--backend", "sim", "--virtual", "--sessions", "8", "--beats", "120",
                       "--profile", "dense", "--context", "1500", "--cost-model", cost,
                       "--out", str(out)]) == 0
    (path,) = out.glob("sim-*.json")
    full = json.loads(path.read_text())["per_run"][0]["trace"]
    first = int(np.flatnonzero(np.array(full["rolls"]))[0])
    assert sum(1 for r in full["rolls"] if r) > 4                  # more beats rolled after it
    assert _slow_beats(full) == [first]
    fast = run_fast(FastConfig(slots=8, lines=8, beats=120, profile="dense", context=1500,
                               cost_model=cost)).per_run[0]["trace"]
    assert _slow_beats(fast) == [int(np.flatnonzero(np.array(fast["rolls"]))[0])]


def test_fit_recovers_the_first_rolls_cost_from_each_files_first_rolling_beat(tmp_path):
    """Catches the first roll's cost left in the jitter (the plain beats' pool then reaches
    the `headroom` threshold at random instead of at the first roll), or fitted from every
    rolling beat."""
    files = [carried_json(tmp_path / f"r{i}.json", seed=i, first_roll_s=FIRST_S / 5)
             for i in range(3)]
    doc = fit.build([fit.read(f) for f in files])
    assert doc["first_roll_s"] == pytest.approx(FIRST_S / 5, rel=0.1)
    assert doc["roll_s"] == pytest.approx(ROLL_S, rel=0.1)
    assert doc["_fit"]["start_rows"]["beats_carrying"]["first_roll_s"] == 3
    without = fit.build([fit.read(carried_json(tmp_path / "n.json"))])
    assert "first_roll_s" not in without or without["first_roll_s"] == pytest.approx(
        0.0, abs=2e-3)
