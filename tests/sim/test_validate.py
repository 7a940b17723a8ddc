"""sim.validate compares a GPU result with its replay, flags what differs, judges rare events
by their counts, and runs end to end."""
import json

import pytest

from sim import fit, validate
from sim.costmodel import CostModel
from sim.verdicts import fisher_p
from tests.sim.fit_kit import bench_json


GPU = {"p50_ms": 100.0, "p99_ms": 110.0, "late_beats": 0, "open_p50_ms": 300.0,
       "open_p99_ms": 600.0, "refusals": 0}


@pytest.mark.parametrize("change, verdict", [
    ({"p50_ms": 109.0, "p99_ms": 101.0, "open_p99_ms": 750.0}, "PASS"),
    ({"p50_ms": 111.0}, "FAIL"),
    ({"p99_ms": 98.0}, "FAIL"),
    ({"open_p99_ms": 900.0}, "FAIL"),
    ({"late_beats": 3}, "FAIL"),
    ({"refusals": 1}, "FAIL"),
])
def test_compare_flags_a_difference_over_ten_percent_and_a_verdict_mismatch(change, verdict):
    """Catches a comparison that passes a sim 11 % off, one whose open-wait p99 is more than
    a beat off, or one whose late beats or refusals disagree with the GPU's."""
    got = validate.compare(GPU, {**GPU, **change})
    assert got["verdict"] == verdict
    assert bool(got["why"]) == (verdict == "FAIL")


@pytest.mark.parametrize("refused, verdict", [((1, 0, 2), "PASS"), ((1, 1, 2), "FAIL")])
def test_over_seeds_a_verdict_agrees_when_some_seed_gives_the_gpus(refused, verdict):
    """Catches a multi-seed comparison that fails a rare event's chance absence (no refusal on
    the GPU, one in some seeds) or passes a sim that refused in every seed; p50/p99 are
    compared by their mean over the seeds."""
    sims = [{**GPU, "refusals": n, "p50_ms": p} for n, p in zip(refused, (100.0, 104.0, 110.0))]
    got = validate.compare(GPU, sims)
    assert got["verdict"] == verdict, got["why"]
    assert got["metrics"]["p50_ms"]["sim"] == pytest.approx(104.667, abs=1e-3)
    assert got["metrics"]["refusals"]["sim_seeds"] == list(refused)
    assert validate.seeds_for({"seed": 3, "runs": 2}, 3) == [3, 5, 7]
    assert validate.seeds_for({}, 2) == [0, 1]


@pytest.mark.parametrize("gpu_refused, sim_refusing, verdict", [
    (1, 30, "PASS"),            # the GPU refused; the sim in 30 % of its runs
    (0, 30, "PASS"),            # the GPU did not; the sim neither in 70 %
    (1, 2, "FAIL"),             # the sim refused in 2 % of its runs only
    (0, 98, "FAIL"),            # ... or took every open in 2 % only
])
def test_with_draws_a_verdict_agrees_when_the_gpus_answer_is_not_rare_in_the_sim(
        gpu_refused, sim_refusing, verdict):
    """Catches a verdict judged on a few seeds alone: three seeds without a refusal failed a
    GPU run that refused by an event the sim gives in 30 % of runs (the first plain beat that
    rolls, under `headroom`), and one lucky seed passed an answer the sim gives once in fifty
    (outside the central 95 % of the sim's runs)."""
    gpu = {**GPU, "refusals": gpu_refused}
    draws = [{**GPU, "refusals": int(i < sim_refusing)} for i in range(100)]
    seeds = [{**GPU, "refusals": 1 - gpu_refused}] * 3        # no seed gave the GPU's answer
    got = validate.compare(gpu, seeds, draws=draws)
    assert got["verdict"] == verdict, got["why"]
    some = sim_refusing + 3 * (1 - gpu_refused)
    assert {k: got["verdicts"]["refusals"][k] for k in ("runs", "with_some", "share")} == {
        "runs": 103, "with_some": some, "share": pytest.approx(some / 103, abs=1e-3)}
    assert validate.compare(gpu, seeds)["verdict"] == "FAIL"     # the seeds alone


def test_fast_mode_draws_replay_the_workload_or_leave_a_workload_it_does_not_model(tmp_path):
    """Catches draws that ignore the GPU run's policy or churn (every draw then a steady run
    that refuses nothing), or that replay a burst the fast mode has no notion of."""
    work = {"profile": "dense", "context": 1500, "sessions": 290, "beats": 120, "runs": 1,
            "churn": 60.0, "policy": ["headroom", "headroom_s=0.1"]}
    model = validate.SIM_DIR / "costmodel_h200_dense.json"
    draws = validate.fast_draws(work, model, [0, 1])
    assert len(draws) == 2 and all(d["refusals"] > 0 for d in draws)   # 60 ms of headroom
    steady = validate.fast_draws({**work, "churn": 0.0, "policy": ["eager"]}, model, [0])
    assert steady[0]["refusals"] == 0
    assert validate.fast_draws({**work, "burst": 10}, model, [0]) is None
    assert validate.fast_draws({**work, "workload": "poisson:rate=2"}, model, [0]) is None


def test_the_workload_comes_from_the_command_with_the_result_fields_over_it():
    """Catches flags lost or misread between the GPU's command and the sim's (argparse's
    prefix matching read `--out` as `--output-slice`)."""
    raw = {"command": "python -m wave_actors.bench --backend graph --out bench/results "
                      "--profile dense --sessions 280 --churn 60 --policy budgeted margin_s=0.004 "
                      "--workers 4 --beats 9", "profile": "dense", "sessions": 290,
           "context": 1500, "beats": 200, "runs": 1, "extra": {"seeds": [7]}}
    work = validate.workload(raw)
    assert work == {"profile": "dense", "context": 1500, "sessions": 290, "beats": 200,
                    "runs": 1, "churn": 60.0, "seed": 7,
                    "policy": ["budgeted", "margin_s=0.004"],
                    "snapshot_mb": 0.0,             # its engine kept no snapshots: none
                    "no_warm": True}                # and its node warmed no prompt
    argv = validate.sim_argv(work, "m.json", "/tmp/x")
    assert argv[:3] == ["--backend", "sim", "--virtual"] and "--workers" not in argv
    # a result of today: its engine's snapshots and its recorded start policy replayed as
    # they were; a result that recorded no policy ran the node's default of its day, eager
    now = {**raw, "command": raw["command"].replace(" --policy budgeted margin_s=0.004", ""),
           "policy": {"start": {"class": "wave_actors.core.sched.start_policy:GuardedStarts",
                                "params": {"margin_s": 0.008}}},
           "extra": {"seeds": [7], "engine": {"snapshots": {"entries": 3}}}}
    assert validate.workload(now)["policy"] == ["wave_actors.core.sched.start_policy:GuardedStarts",
                                                "margin_s=0.008"]
    assert "snapshot_mb" not in validate.workload(now)
    assert validate.workload({**now, "command": now["command"] + " --snapshot-mb 300"}
                             )["snapshot_mb"] == 300.0
    assert validate.workload({**now, "policy": {}})["policy"] == ["eager"]
    # a node that warmed its prompts before the run is replayed as one that does
    warmed = {**now, "per_run": [{"snapshots": {"hits": 3, "warm": {"asked": 1, "ready": 1}}}]}
    assert "no_warm" not in validate.workload(warmed) and validate.workload(now)["no_warm"]
    calls = validate.workload({**raw, "command": raw["command"] + " --workload poisson:rate=2"})
    assert calls["workload"] == "poisson:rate=2"
    assert "poisson:rate=2" in validate.sim_argv(calls, "m.json", "/tmp/x")


@pytest.mark.slow
def test_validate_replays_a_small_gpu_result_end_to_end(tmp_path, capsys):
    """Catches a replay that does not run the sim (or writes its result into bench/results),
    or a comparison that fails a sim run on the very model the GPU result follows."""
    gpu = bench_json(tmp_path / "graph-reference-n4.json", sessions=4, beats=30)
    model = tmp_path / "model.json"
    assert fit.main([gpu, "-o", str(model)]) == 0
    out = tmp_path / "cmp.json"
    rc = validate.main([gpu, "--cost-model", str(model), "--json", str(out)])
    doc = json.loads(out.read_text())
    row, = doc["files"]
    assert rc == 0 and row["verdict"] == "PASS", capsys.readouterr().out
    assert row["held_out"] is False and "<tmp>" in row["sim_command"]
    assert abs(row["metrics"]["p50_ms"]["diff_pct"]) < 2.0
    assert validate.main([gpu, "--cost-model", str(model), "--seeds", "2", "--json", str(out)]) == 0
    row, = json.loads(out.read_text())["files"]
    assert [c.split("--seed ")[1].split()[0] for c in row["sim_commands"]] == ["0", "1"]
    assert len(row["metrics"]["p99_ms"]["sim_seeds"]) == 2
    row, = json.loads(out.read_text())["files"]
    assert row["verdicts"]["refusals"]["runs"] == 2 + validate.DRAWS
    assert validate.main([gpu, "--seeds", "0"]) == 2
    assert validate.main([gpu, "--draws", "-1"]) == 2


def test_a_gpu_result_is_compared_over_the_beats_it_counted():
    """Catches a replay compared over other beats than its GPU result counted: a result of
    today (`measured` recorded: its headline counts every beat, first open to last close)
    against the replay's headline; an older one (its headline was the measured window)
    against the replay's measured window, whose late beats and p99 leave the ramp out."""
    old = {"p50_ms": 138.0, "p99_ms": 150.0, "late_beats": 0, "per_run": [{}]}
    new = {**old, "measured": {}, "per_run": [{"windows": {}}]}
    assert validate.window(old) == "measured" and validate.window(new) == "all"
    sim = {"p50_ms": 137.0, "p99_ms": 190.0, "late_beats": 5,       # a late ramp
           "measured": {"p50_ms": 138.5, "p99_ms": 151.0, "late_beats": 0},
           "per_run": [{"refusals": 0, "open_p50_ms": 1.0, "open_p99_ms": 2.0}]}
    got = validate.metrics(sim, validate.window(old))
    assert (got["p50_ms"], got["p99_ms"], got["late_beats"]) == (138.5, 151.0, 0)
    assert validate.compare(validate.metrics(old), [got])["verdict"] == "PASS"
    got = validate.metrics(sim, validate.window(new))
    assert (got["p50_ms"], got["p99_ms"], got["late_beats"]) == (137.0, 190.0, 5)
    assert validate.compare(validate.metrics(new), [got])["verdict"] == "FAIL"
    with pytest.raises(validate.ValidateError, match="measured"):
        validate.metrics({k: v for k, v in sim.items() if k != "measured"}, "measured")


def test_a_replay_prices_beats_at_the_buckets_the_gpu_captured(tmp_path):
    """Catches a replay on the whole ladder of a GPU run whose engine captured less (before
    the ladder only its top bucket; a 300-slot dense H200 only 256 and 300, short of memory):
    its ramp beats of few sessions then cost a fraction of what the GPU ran them at."""
    raw = {"extra": {"engine": {"buckets_captured": [300, 256]}}}
    assert validate.captured(raw) == [256, 300] and validate.captured({"extra": {}}) == []
    dense = validate.SIM_DIR / "costmodel_h200_dense.json"
    model = CostModel.load(validate.with_buckets(dense, [256, 300], tmp_path), "dense")
    whole = CostModel.load(dense, "dense")
    assert model.buckets == (256, 300)
    assert model.beat_time(1, 1500, 300) == whole.beat_time(256, 1500, 300) \
        > 4 * whole.beat_time(1, 1500, 300)
    assert validate.with_buckets(dense, [], tmp_path) == dense      # none recorded: as it is


@pytest.mark.parametrize("gpu_refused, verdict", [(0, "PASS"), (2, "PASS"), (9, "FAIL")])
def test_refusals_are_judged_as_a_rate_not_as_some_or_none(gpu_refused, verdict):
    """Catches the yes/no rule that passed a GPU run whatever it refused once the sim refused
    in some of its runs: here 28 % of the sim's runs refuse 1 or 2 of 600 tries, so a GPU run
    with 9 refusals is far outside them, while none or 2 are not."""
    gpu = {**GPU, "refusals": gpu_refused, "tries": 600}
    draws = [{**GPU, "refusals": (1 + i % 2) if i < 28 else 0, "tries": 600}
             for i in range(100)]
    got = validate.compare(gpu, draws[:1], draws=draws[1:])
    assert got["verdict"] == verdict, got["why"]
    assert got["verdicts"]["refusals"]["sim_interval"] == [0.0, round(2 / 600, 6)]


def test_held_out_runs_are_counted_apart_from_those_fitted_on():
    rows = [{"held_out": True, "verdict": "PASS"}, {"held_out": True, "verdict": "FAIL"},
            {"held_out": False, "verdict": "PASS"}]
    assert validate.held_apart(rows) == {"held out": {"files": 2, "pass": 1},
                                         "fitted on": {"files": 1, "pass": 1}}


@pytest.mark.parametrize("sim_refused, verdict", [(112, "PASS"), (40, "FAIL")])
def test_few_runs_judge_a_rate_by_its_counts_not_by_one_runs_point(sim_refused, verdict):
    """Catches the range of one run standing in for an interval: a workload replayed once
    (no draws) refused 112 of 3,100 tries where the GPU refused 122 of 3,183, and the point
    3.6 % failed the GPU's 3.8 %, a difference chance gives (Fisher: p ≈ 0.7). A sim that
    refuses 40 is still told apart."""
    gpu = {**GPU, "refusals": 122, "tries": 3183, "beats": 1000}
    got = validate.compare(gpu, [{**GPU, "refusals": sim_refused, "tries": 3100, "beats": 1000}])
    assert got["verdict"] == verdict, got["why"]
    row = got["verdicts"]["refusals"]
    assert row["test"] == "fisher" and (row["p"] < 0.05) == (verdict == "FAIL")
    assert got["verdicts"]["late_beats"] == {**got["verdicts"]["late_beats"], "test": "fisher",
                                             "p": 1.0}


def test_fishers_exact_test_gives_the_textbook_p_values():
    # 3 of 10 against 1 of 10: two-sided p = 0.5820 (the 2x2 table's hypergeometric tail)
    assert fisher_p(3, 10, 1, 10) == pytest.approx(0.58204, abs=1e-4)
    assert fisher_p(0, 10, 0, 10) == 1.0
    assert fisher_p(10, 10, 0, 10) == pytest.approx(1.0825e-5, rel=1e-3)
