"""An honest bench (wave_actors/bench/capacity.py): every beat with a live session counts, from the first
open to the last close. A late beat while the callers dial in (the ramp) is in the headline late
count, in the calls that heard it and in find-max's verdict; `--beats` still sizes the measured
window, reported apart. And the occupancy workload (`poisson:occupancy=X,hold=H`) through the
bench: its rate from the node's slots, its measured window after the fill.

The late ramp beat is planted with the sim's cost model: the first beat that rolls a context
costs FIRST_ROLL_S more, once a run; at `--context 64` sessions roll within their first beats
live, long before the warm-up's on-time beats let the measured window begin."""
import json
from pathlib import Path

import pytest

from wave_actors.bench import capacity, cli
from wave_actors.core.frames import BEAT_S

ROOT = Path(__file__).resolve().parents[2]
FIRST_ROLL_S = 0.3          # past the deadline on its own


@pytest.fixture(scope="module")
def slow_first_roll(tmp_path_factory) -> str:
    raw = json.loads((ROOT / "sim" / "costmodel.json").read_text())
    raw["first_roll_s"] = FIRST_ROLL_S
    path = tmp_path_factory.mktemp("cost") / "first_roll.json"
    path.write_text(json.dumps(raw))
    return str(path)


def _args(cost: str, out: Path, *more: str):
    return cli.parse_args(["--backend", "sim", "--virtual", "--sessions", "4", "--beats", "20",
                             "--context", "64", "--cost-model", cost, "--out", str(out), *more])


@pytest.fixture(scope="module")
def ramp_late_run(slow_first_roll, tmp_path_factory) -> dict:
    """One run whose only late beats are in the ramp, written as the bench writes it."""
    out = tmp_path_factory.mktemp("run")
    assert cli.main(["--backend", "sim", "--virtual", "--sessions", "4", "--beats", "20",
                       "--context", "64", "--cost-model", slow_first_roll, "--out",
                       str(out)]) == 0
    (path,) = out.glob("sim-*.json")
    return json.loads(path.read_text())


def test_a_late_beat_in_the_fill_counts_in_the_headline(ramp_late_run):
    """Catches the headline (late beats, p99) taken over the measured window alone: the planted
    late beat is in the ramp, and the measured beats are all on time."""
    res = ramp_late_run
    run = res["per_run"][0]
    w = run["windows"]
    assert w["measured"]["beats"] == 20 and w["measured"]["late_beats"] == 0
    assert w["ramp"]["late_beats"] >= 1
    assert w["ramp"]["to_s"] == w["measured"]["from_s"]              # the windows abut
    assert run["late_beats"] == w["all"]["late_beats"] == w["ramp"]["late_beats"]
    assert run["beats"] == w["all"]["beats"] == sum(w[k]["beats"]
                                                    for k in ("ramp", "measured", "drain"))
    assert res["late_beats"] == run["late_beats"] and res["beats_all"] == run["beats"]
    assert res["beats"] == 20 and res["measured"]["late_beats"] == 0     # --beats: the window
    assert run["max_ms"] >= 1e3 * FIRST_ROLL_S and res["p99_ms"] > 1e3 * BEAT_S
    assert res["measured"]["p99_ms"] < 1e3 * BEAT_S
    assert res["window_of"]["beats"] == "measured"
    assert "ramp" in run["window_of"] and "every beat" in run["window_of"]["all"]


def test_a_late_beat_outside_the_measured_window_is_broken_down(ramp_late_run):
    """Catches a late fill or hang-up beat reported only as a count: the trace covers the
    measured beats, so the slowest ramp and drain beats are kept apart with their breakdown."""
    run = ramp_late_run["per_run"][0]
    worst = run["outside"][0]
    assert worst["window"] == "ramp" and worst["latency_ms"] >= 1e3 * FIRST_ROLL_S
    assert worst["compute_ms"] >= 1e3 * FIRST_ROLL_S and worst["rolls"] >= 1
    assert {"begin_ms", "wake_ms", "after_ms", "gc_ms", "sessions"} <= set(worst)
    lat = [b["latency_ms"] for b in run["outside"]]
    assert lat == sorted(lat, reverse=True)
    n_outside = run["windows"]["ramp"]["beats"] + run["windows"]["drain"]["beats"]
    assert len(lat) == min(8, n_outside)


def test_a_calls_late_beat_outside_the_measured_window_still_marks_the_call(ramp_late_run):
    """Catches deadline metrics matched against the measured beats only: every caller was live
    through the late ramp beats, so every call heard them, though the window had none."""
    run = ramp_late_run["per_run"][0]
    late = run["windows"]["ramp"]["late_beats"]
    assert [c["late_beats"] for c in run["calls"]] == [late] * 4
    d = run["deadlines"]
    assert d["calls_with_late_beats"] == 4 and d["glitch_s_per_call_hour"] > 0
    assert d["beats_counted"] == run["beats"] and d["late_beats_counted"] == late
    for c in run["calls"]:        # each call's life: from its open to its close, every beat
        assert c["opened_s"] < run["windows"]["measured"]["from_s"] < c["ended_s"]
        assert c["live_beats"] == run["beats"]


def test_find_max_fails_an_n_on_a_late_ramp_beat(slow_first_roll, tmp_path):
    """Catches find-max's verdict (and --fail-fast) looking at the measured beats alone: the
    first roll is late at every N, so no N passes, and each run stops in its ramp."""
    args = _args(slow_first_roll, tmp_path, "--find-max", "--max-find", "4")
    found, seen = capacity.find_max(args)
    assert found == 0 and 4 in seen
    for runs in seen.values():
        (res,) = runs
        assert res.late_beats >= 1 and res.windows["measured"]["beats"] == 0


def test_the_occupancy_workload_through_the_bench(tmp_path):
    """`--workload poisson:occupancy=0.75,hold=2` on 4 slots: the rate is 0.75 * 4 / 2 = 1.5 a
    second from --sessions, calls arrive for the fill (3 holds) plus --beats beats, those beats
    are the measured window, and the run reports blocking, glitch-seconds and open waits over
    every call. Catches the slots not passed, the window not after the fill, and the headline
    over the window."""
    out = tmp_path / "out"
    assert cli.main(["--backend", "sim", "--virtual", "--sessions", "4", "--beats", "25",
                       "--workload", "poisson:occupancy=0.75,hold=2", "--out", str(out)]) == 0
    (path,) = out.glob("sim-*.json")
    res = json.loads(path.read_text())
    wl = res["extra"]["workload"]
    assert wl["occupancy"]["slots"] == 4 and wl["params"]["rate"] == pytest.approx(1.5)
    assert wl["params"]["duration"] == pytest.approx(6.0 + 25 * BEAT_S)
    run = res["per_run"][0]
    w = run["windows"]
    assert 6.0 <= w["measured"]["from_s"] < 6.0 + BEAT_S
    assert 20 <= w["measured"]["beats"] <= 25
    assert w["ramp"]["beats"] > 0 and w["drain"]["beats"] > 0
    assert run["beats"] == w["all"]["beats"] == sum(w[k]["beats"]
                                                    for k in ("ramp", "measured", "drain"))
    d = run["deadlines"]
    assert d["calls"] == wl["calls"] == len(run["calls"])
    assert d["blocking"] == pytest.approx(d["blocked"] / d["calls"], abs=1e-6)
    assert "glitch_s_per_call_hour" in d and d["open_wait"]["n"] == d["opened"]
    assert d["open_wait"]["p50_ms"] <= d["open_wait"]["p99_ms"]
    assert d["beats_counted"] == run["beats"]
    # explicit slots= in the spec win over --sessions
    args = cli.parse_args(["--backend", "sim", "--sessions", "4", "--workload",
                             "poisson:occupancy=0.5,hold=10,slots=40,duration=60"])
    assert args.workload_obj.source["params"]["rate"] == pytest.approx(2.0)


@pytest.mark.parametrize("spec,says", [
    ("poisson:occupancy=0,hold=120", "0 < occupancy <= 1"),
    ("poisson:occupancy=1.5,hold=120", "0 < occupancy <= 1"),
    ("poisson:occupancy=0.9,hold=0", "hold"),
    ("poisson:occupancy=0.9,rate=2,hold=120", "not both"),
])
def test_the_bench_refuses_a_bad_occupancy_spec_in_one_line(spec, says, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["--backend", "sim", "--sessions", "8", "--workload", spec])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


@pytest.mark.slow
def test_a_worker_engines_start_policy_is_recorded_as_it_ran(tmp_path):
    """Bug caught: with `--workers` the clock and its start policy run in the engine process;
    the result recorded the front's copy, as it was given (no beat observed, priors only)."""
    assert cli.main(["--backend", "sim", "--sessions", "2", "--beats", "6", "--runs", "1",
                       "--workers", "1", "--out", str(tmp_path)], "test") == 0
    (path,) = tmp_path.glob("*.json")
    start = json.loads(path.read_text())["per_run"][0]["policies"]["start"]
    assert start["name"] == "guarded" and start["beats_observed"] > 0
