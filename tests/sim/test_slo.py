"""`python -m sim.slo`: capacity in offered Erlangs under SLOs, by bisection on the load."""
import json

import pytest

from sim import slo
from sim.fast.fast import FastConfig

SPEC = "poisson:rate=0.2,duration=200,call=20"
SLO = {"blocking": 0.05, "p99_ms": 150.0}


@pytest.mark.slow
def test_the_capacity_found_meets_the_slo_and_a_quarter_more_load_does_not():
    """Catches a search that reports a load it never checked, or a bracket kept on the wrong
    side (the capacity then fails its own SLO, or sits far below the boundary)."""
    base = FastConfig(slots=8, workload=slo.scaled(SPEC, 1.0, 0))
    found = slo.search(base, SPEC, SLO, seed=0, tolerance=0.02)
    at = slo.probe(base, SPEC, SLO, found["scale"], 0)
    above = slo.probe(base, SPEC, SLO, 1.25 * found["scale"], 0)
    print(f"\ncapacity {found['capacity_erlangs']} Erlangs at scale {found['scale']:.3f}: "
          f"{at['metrics']}; x1.25: {above['offered_erlangs']} Erlangs, {above['metrics']}")
    assert at["ok"] and at["offered_erlangs"] == found["capacity_erlangs"]
    assert not above["ok"]
    assert found["failing_scale"] / found["scale"] <= 1.02 + 1e-9


def test_a_scaled_workload_offers_proportionally_more(tmp_path):
    """Catches a scale applied to the wrong parameter (call length, duration) or a file's
    arrivals stretched instead of compressed."""
    one, two = slo.scaled(SPEC, 1.0, 3), slo.scaled(SPEC, 2.0, 3)
    assert two.offered_erlangs() == pytest.approx(2 * one.offered_erlangs(), rel=0.3)
    path = one.save(tmp_path / "calls.csv")
    fast = slo.scaled(str(path), 2.0, 0)
    assert fast.offered_erlangs() == pytest.approx(2 * one.offered_erlangs(), rel=0.05)


def test_the_occupancy_form_scales_its_rate_and_keeps_its_window():
    """Catches a scale the occupancy form ignores (`poisson:occupancy=X,hold=H` has no `rate`
    to multiply: every probe then offered the same load, and the search ran off its ends) or
    one that refuses an occupancy past 1, and a scaled form that loses its measured span."""
    from wave_actors.bench.workload import generate
    spec = "poisson:occupancy=0.5,hold=20"
    one, two = slo.scaled(spec, 1.0, 3, slots=8), slo.scaled(spec, 3.0, 3, slots=8)
    assert one.calls == generate(spec, 3, slots=8).calls        # scale 1: the form's own calls
    assert two.offered_erlangs() == pytest.approx(3 * one.offered_erlangs(), rel=0.3)
    assert one.window_s == two.window_s == generate(spec, 3, slots=8).window_s is not None
    assert two.source["occupancy"]["target_erlangs"] == pytest.approx(12.0)
    assert slo.scaled(spec + ",slots=16", 1.0, 3).calls == generate(spec, 3, slots=16).calls
    base = FastConfig(slots=8, workload=one)
    assert slo.probe(base, spec, SLO, 3.0, 3)["offered_erlangs"] == pytest.approx(
        two.offered_erlangs(), rel=1e-3)


@pytest.mark.slow
def test_the_command_writes_capacity_with_an_interval_and_what_it_ran(tmp_path, capsys):
    """Catches a result that does not say what it measured (SLO, policy and its parameters,
    workload, seeds, cost model), an interval that does not hold its mean, or an `--out`
    folder that fails the run at its very end (the result written inside it, named as the
    default is)."""
    assert slo.main(["--workload", SPEC, "--slots", "8", "--slo", "blocking=0.05",
                     "--seeds", "2", "--policy", "budgeted", "max_hold=3",
                     "--out", str(tmp_path)]) == 0
    print(capsys.readouterr().out)
    out, = tmp_path.glob("slo-*.json")
    r = json.loads(out.read_text())
    assert r["slo"] == {"blocking": 0.05} and r["seeds"] == [0, 1]
    assert r["policy"]["name"] == "budgeted" and r["policy"]["params"]["max_hold"] == 3
    assert r["workload"] == SPEC and r["cost_model"].endswith(".json")
    assert r["commit"] == r["provenance"]["commit"] and "dirty" in r["provenance"]
    lo, hi = r["capacity_erlangs"]["ci95"]
    assert lo <= r["capacity_erlangs"]["mean"] <= hi
    assert len(r["per_seed"]) == 2


@pytest.mark.parametrize("words", [["bogus=1"], ["late"], ["p99_ms=fast"]])
def test_a_bad_slo_is_one_line_and_exit_2(words, capsys):
    rc = slo.main(["--workload", SPEC, "--slots", "8", "--slo", *words])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--slo" in err


def test_the_t_interval_uses_students_t():
    mean, lo, hi = slo.t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and hi - mean == pytest.approx(4.303 * 1.0 / 3 ** 0.5)
