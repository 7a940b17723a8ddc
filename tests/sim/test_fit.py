"""sim.fit recovers a known cost model from bench JSONs and refuses what it cannot use; the
fitted model draws deterministically."""
import dataclasses
import random

import numpy as np
import pytest

from sim import fit
from sim.costmodel import DEFAULT_PATH, CostModel
from tests.sim.fit_kit import (BEAT_S, HOST_S, RESET_S, ROLL_S, ROW_ROLL_S, ROWS_S, SMALL_S,
                               bench_json, carried_json)


def test_fit_recovers_the_beat_host_time_and_start_rows_of_a_known_model(tmp_path):
    """Catches a fit that mixes the host's time into the executor's beat, keys beats by the
    wrong size, or takes the start rows' cost without the beat under them."""
    files = [bench_json(tmp_path / f"g{i}.json", seed=i) for i in range(3)]
    doc = fit.build([fit.read(f) for f in files])
    (n, beat_s), = doc["beat_points"]
    assert n == 100 and beat_s == pytest.approx(BEAT_S, rel=0.005)
    assert np.median(doc["host_s"]) == pytest.approx(HOST_S, abs=2e-5)
    assert doc["start_rows_s"] == pytest.approx(ROWS_S, abs=1e-4)
    assert np.percentile(doc["residuals"], 99) == pytest.approx(0.0233, abs=0.005)   # 1 % std
    assert [s["file"] for s in doc["_fitted_from"]] == ["g0.json", "g1.json", "g2.json"]
    assert doc["_fitted_from"][0]["commit"] == "abc1234"


def test_a_beat_costs_the_ladder_bucket_that_holds_its_sessions(tmp_path):
    """Catches a model that prices a beat at its live count (cheaper than the padded bucket
    the GPU replays) or at the top bucket (dearer: the graph executor captures a ladder of
    buckets, `wave_actors/core/sched/buckets.py`), or whose top bucket is not the node's slots."""
    model = fit.model_of(fit.build([fit.read(bench_json(tmp_path / "g.json"))]))
    at = lambda n, slots=None: model.beat_time(n, 1500, slots)  # noqa: E731
    assert at(16) < at(17) < at(64) < at(100) < at(120)            # no ladder given: n itself
    assert at(17, 100) == at(24) and at(60, 100) == at(64) and at(0, 100) == at(1)
    assert at(97, 100) == at(100, 100) == at(100)                  # the top bucket: the slots
    assert at(257, 300) == at(300, 300) == at(300) > at(256, 300) == at(256)
    assert model.batch(129, 300) == 160 and model.batch(129) == 129
    cut = dataclasses.replace(model, buckets=(256, 300))    # a ladder cut short by memory
    assert cut.batch(1, 300) == cut.batch(256, 300) == 256 and cut.batch(257, 300) == 300
    assert cut.beat_time(1, 1500, 300) == at(256) and cut.beat_time(1, 1500) == at(1)
    assert dataclasses.replace(model, buckets=(290,)).batch(16, 290) == 290   # no ladder


def test_heldout_errors_are_small_for_runs_of_the_same_model(tmp_path):
    """Catches a held-out prediction that draws from the wrong parts (compute for latency)."""
    measured = [fit.read(bench_json(tmp_path / f"g{i}.json", seed=i)) for i in range(3)]
    held = fit.heldout(measured)
    assert len(held["rows"]) == 3
    assert all(abs(v) < 1.0 for v in held["max_abs_error_pct"].values())


@pytest.mark.parametrize("kwargs, says", [
    ({"backend": "sim"}, "a sim result"),
    ({"trace": False}, "no per-beat traces"),
    ({"gpu": "none (x86_64)"}, "measured on no GPU"),
])
def test_fit_refuses_input_it_cannot_use_in_one_line(tmp_path, capsys, kwargs, says):
    """Catches a fit that silently fits a sim's own output, or a result without beats."""
    assert fit.main([bench_json(tmp_path / "bad.json", **kwargs), "-o",
                     str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err
    assert not (tmp_path / "out.json").exists()


def test_fit_refuses_mixed_profiles(tmp_path, capsys):
    """Catches a model fitted over two profiles' beats (one average of two machines)."""
    files = [bench_json(tmp_path / "r.json"), bench_json(tmp_path / "d.json", profile="dense")]
    assert fit.main(files + ["-o", str(tmp_path / "out.json")]) == 2
    assert "mixed profiles" in capsys.readouterr().err


def test_fit_refuses_a_file_that_is_not_json(tmp_path, capsys):
    """Catches a traceback where a one-line error is due."""
    (tmp_path / "x.json").write_text("{not json")
    assert fit.main([str(tmp_path / "x.json")]) == 2
    assert "not a readable bench result" in capsys.readouterr().err


def test_draws_are_deterministic_for_a_seed_and_come_from_the_measured_samples(tmp_path):
    """Catches draws from an unseeded source (runs not reproducible) or outside the sample."""
    model = fit.model_of(fit.build([fit.read(bench_json(tmp_path / "g.json"))]))
    draw = lambda seed: [model.draw_beat(100, 1500, 0, 0, 16, r)
                         for r in [random.Random(seed)] for _ in range(50)]
    assert draw(3) == draw(3) and draw(3) != draw(4)
    lo = model.beat_points[0][1] * (1 + min(model.residuals)) + min(model.host_s)
    hi = model.beat_points[0][1] * (1 + max(model.residuals)) + max(model.host_s)
    assert all(lo - 1e-12 <= d <= hi + 1e-12 for d in draw(5))


def test_the_roofline_default_still_loads_and_draws_as_before():
    """Catches a change to the roofline default that existing sims and tests depend on."""
    m = CostModel.load(DEFAULT_PATH, "reference")
    assert not m.beat_points and m.beat_time(120, 1500) == m.roofline_time(120, 1500)
    assert m.draw_beat(120, 1500, 16, 16, 16, random.Random(0)) == pytest.approx(
        m.beat_time(120, 1500) + m.start_rows_s)


def test_fit_separates_rows_resets_and_rolls_when_the_trace_says_what_each_beat_carried(
        tmp_path):
    """Catches a model blind to resets and context rolls (a churn run's slow beats then come
    out on time in the sim), costs taken from GC spikes, or the bucket's time including the
    average roll (counted twice once the sim adds rolls)."""
    files = [carried_json(tmp_path / f"c{i}.json", seed=i) for i in range(2)]
    doc = fit.build([fit.read(f) for f in files])
    (n, beat_s), = doc["beat_points"]
    assert n == 100 and beat_s == pytest.approx(BEAT_S, rel=0.005)
    assert doc["start_rows_s"] == pytest.approx(ROWS_S, rel=0.05)
    assert doc["small_rows_s"] == pytest.approx(SMALL_S, rel=0.05)
    assert doc["reset_s"] == pytest.approx(RESET_S, rel=0.1)
    assert doc["roll_s"] == pytest.approx(ROLL_S, rel=0.1)
    assert doc["row_roll_s"] == pytest.approx(ROW_ROLL_S, rel=0.2)
    assert doc["_fit"]["start_rows"]["beats_trimmed"] >= 8            # the spikes
    model = fit.model_of(doc)
    assert model.draw_parts(100, 1500, 0, 0, 16, random.Random(0), resets=2, rolls=4)[0] \
        == pytest.approx(BEAT_S + 2 * RESET_S + 4 * ROLL_S, rel=0.03)
    assert model.draw_parts(100, 1500, 16, 16, 16, random.Random(0), rolls=4)[0] \
        == pytest.approx(BEAT_S + ROWS_S + 4 * (ROLL_S + ROW_ROLL_S), rel=0.03)
    held = fit.heldout([fit.read(f) for f in files])
    assert all(abs(v) < 2.0 for v in held["max_abs_error_pct"].values()), held


def test_beats_with_start_rows_keep_their_own_wider_jitter(tmp_path):
    """Catches one jitter pool for all beats: the wide spread of beats with start rows then
    lands on the beats without, and a policy reading those (`headroom`) refuses opens the GPU
    took (every seed refused where the GPU run did not)."""
    doc = fit.build([fit.read(carried_json(tmp_path / "w.json", row_noise=0.03))])
    plain, wide = doc["_fit"]["residual_pct"], doc["_fit"]["row_residual_pct"]
    assert wide["p99"] > 3 * plain["p99"] and plain["p99"] < 2.0
    model = fit.model_of(doc)
    spread = lambda rows: np.std([model.draw_parts(100, 1500, rows, 16, 16, r)[0]
                                  for r in [random.Random(1)] for _ in range(400)])
    assert spread(16) > 3 * spread(0)
