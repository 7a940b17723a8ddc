"""sim.fit recovers a known cost model from bench JSONs and refuses what it cannot use; the
fitted model draws deterministically; sim.validate compares, flags and runs end to end."""
import dataclasses
import json
import random

import numpy as np
import pytest

from sim import fit, validate
from sim.costmodel import DEFAULT_PATH, CostModel
from sim.verdicts import fisher_p

BEAT_S, HOST_S, ROWS_S = 0.100, 0.002, 0.020      # the known model the synthetic runs follow


def bench_json(path, profile="reference", sessions=100, beats=200, backend="graph",
               gpu="NVIDIA H200", seed=0, trace=True, command=None):
    """A GPU-like bench result whose beats follow BEAT_S (±1 % noise), HOST_S and ROWS_S."""
    rng = np.random.default_rng(seed)
    compute = BEAT_S * (1 + 0.01 * rng.standard_normal(beats))
    latency = compute + HOST_S
    ms = lambda xs: [round(1e3 * float(x), 3) for x in xs]
    ramp = [{"beat": b, "compute_ms": 1e3 * (BEAT_S + ROWS_S), "wake_ms": 0.0,
             "sessions": 16 * b, "rows": 16, "resets": 0, "rolls": 0} for b in range(1, 6)]
    run = {"sessions": sessions, "beats": beats, "late_beats": 0,
           "p50_ms": float(np.percentile(1e3 * latency, 50)),
           "p99_ms": float(np.percentile(1e3 * latency, 99)), "refusals": 0,
           "open_p50_ms": 160.0, "open_p99_ms": 240.0, "compute_p50_ms": 1e3 * BEAT_S,
           "ramp": {"beats": 5, "slowest": ramp},
           "trace": {"latency_ms": ms(latency), "compute_ms": ms(compute),
                     "gc_ms": [0.0] * beats, "sessions": [sessions] * beats} if trace else {}}
    doc = {"backend": backend, "profile": profile, "context": 1500, "sessions": sessions,
           "runs": 1, "beats": beats, "late_beats": 0, "p50_ms": run["p50_ms"],
           "p99_ms": run["p99_ms"], "virtual": backend == "sim", "gpu": gpu, "commit": "abc1234",
           "command": command or f"python -m wave_actors.bench --backend {backend} --profile "
                                 f"{profile} --sessions {sessions} --beats {beats} --out x",
           "per_run": [run], "extra": {"engine": {"buckets_captured": [sessions]}}}
    path.write_text(json.dumps(doc))
    return str(path)


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


RESET_S, ROLL_S, ROW_ROLL_S, SMALL_S = 0.003, 0.0015, 0.001, 0.008


def carried_json(path, seed=0, beats=400, sessions=100, row_noise=0.005, first_roll_s=0.0):
    """A GPU-like result whose trace says what each beat carried, and whose beats cost
    BEAT_S + the rows' capture + RESET_S a reset + ROLL_S a roll, ROW_ROLL_S more in a beat
    with rows (±0.5 % noise), with a few
    GC-like spikes the fit must not take for work. With `first_roll_s`, no beat rolls before
    beat 20, which rolls without start rows and costs that much more."""
    rng = np.random.default_rng(seed)
    rows = rng.choice([0, 0, 0, 1, 3, 16], beats)
    resets = np.where(rows > 0, rng.integers(0, 3, beats), 0)
    rolls = rng.integers(0, 5, beats)
    if first_roll_s:
        rolls[:20], rolls[20], rows[20], resets[20] = 0, 2, 0, 0
    capture = np.array([fit.START_SHAPE.capture_for(int(r)) for r in rows])
    compute = (BEAT_S + np.where(rows == 0, 0.0, np.where(capture < 16, SMALL_S, ROWS_S))
               + RESET_S * resets + (ROLL_S + ROW_ROLL_S * (rows > 0)) * rolls) \
        * (1 + np.where(rows > 0, row_noise, 0.005) * rng.standard_normal(beats))
    compute[20] += first_roll_s
    compute[::97] += 0.030
    path = bench_json(path, sessions=sessions, beats=beats, seed=seed)
    doc = json.loads(open(path).read())
    ms = lambda xs: [round(1e3 * float(x), 3) for x in xs]
    doc["per_run"][0]["trace"].update(compute_ms=ms(compute), latency_ms=ms(compute + HOST_S),
                                      rows=rows.tolist(), resets=resets.tolist(),
                                      rolls=rolls.tolist())
    open(path, "w").write(json.dumps(doc))
    return path


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
