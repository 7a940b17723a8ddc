"""Workloads (wave_actors/bench/workload.py) and the full node serving one (`--workload`): files and
seeded generators give the calls, the bench's callers dial, redial and stream as each call
says, and every call comes back as a record with its deadline metrics."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from wave_actors.bench import workload as wl
from wave_actors.bench.deadlines import CallRecord, summarize
from tests.sim.simrun import sim_run
from wave_actors.core.frames import BEAT_S

ROOT = Path(__file__).resolve().parents[2]
SPECS = ["poisson:rate=2,duration=300,call=30", "diurnal:peak=3,duration=600,trough=0.1",
         "bursty:rate=4,duration=300,on=10,off=30", "flash:rate=0.5,duration=300,at=100,calls=80",
         "retry:rate=0.5,duration=300,at=100,calls=80"]


@pytest.mark.parametrize("spec", SPECS)
def test_a_generator_draws_the_same_calls_from_one_seed_and_others_from_another(spec):
    """Catches a generator drawing from a global or unseeded source (two runs of one command
    would serve different calls) or ignoring the seed (every seed the same trace)."""
    a, b, c = wl.generate(spec, 4), wl.generate(spec, 4), wl.generate(spec, 5)
    assert a.calls == b.calls and a.calls != c.calls
    assert all(x.at_s <= y.at_s for x, y in zip(a.calls, a.calls[1:]))
    assert a.describe()["seed"] == 4 and a.describe()["spec"] == spec


def test_generators_shape_their_arrivals():
    """Catches generators that ignore their shape: the diurnal rate must peak mid-period, a
    flash crowd must put its calls in its window, a retry storm's callers must redial."""
    day = wl.generate("diurnal:peak=4,duration=1000,trough=0.1", 1)
    at = np.array([c.at_s for c in day.calls])
    middle, edges = ((at > 375) & (at < 625)).sum(), ((at < 125) | (at > 875)).sum()
    assert middle > 3 * edges
    crowd = wl.generate("flash:rate=0.1,duration=300,at=100,calls=200,width=5", 1)
    burst = sum(100 <= c.at_s < 105 for c in crowd.calls)
    assert burst >= 200
    storm = wl.generate("retry:rate=0.1,duration=300,at=100,calls=50", 1)
    assert all(c.redials == 8 and c.redial_after_s == 0.5 for c in storm.calls)
    rate = wl.generate("poisson:rate=2,duration=2000,call=30", 2)
    assert len(rate.calls) == pytest.approx(4000, rel=0.1)
    assert rate.offered_erlangs() == pytest.approx(60, rel=0.1)


def test_the_occupancy_form_draws_poisson_arrivals_at_occupancy_times_slots_over_hold():
    """poisson:occupancy=0.95,hold=120 on 100 slots: arrivals at 0.95 * 100 / 120 a second, call
    lengths exponential of mean 120 s. Catches a rate not derived from the slots (or the hold),
    and holding times not of the mean asked. Bounds: 4 standard deviations of a Poisson count
    (sqrt of its mean) and of a mean of exponentials (hold / sqrt(n)); the seed is fixed."""
    duration, rate = 4000.0, 0.95 * 100 / 120
    w = wl.generate(f"poisson:occupancy=0.95,hold=120,duration={duration:g}", 7, slots=100)
    expected = rate * duration
    assert w.source["params"]["rate"] == pytest.approx(rate)
    assert abs(len(w.calls) - expected) <= 4 * np.sqrt(expected)
    holds = np.array([c.duration_s for c in w.calls])
    assert abs(holds.mean() - 120) <= 4 * 120 / np.sqrt(len(holds))
    assert w.source["occupancy"]["target_erlangs"] == pytest.approx(95)
    # slots= in the spec is the same as slots from the caller, and wins over it
    same = wl.generate(f"poisson:occupancy=0.95,hold=120,duration={duration:g},slots=100", 7,
                       slots=3)
    assert same.calls == w.calls
    # the arrivals' mean over seeds: no bias beyond the noise of 20 draws
    counts = [len(wl.generate("poisson:occupancy=0.5,hold=10,duration=400", s, slots=20).calls)
              for s in range(20)]
    assert abs(np.mean(counts) - 400) <= 4 * np.sqrt(400 / 20)


def test_the_occupancy_form_lasts_a_fill_and_the_measured_beats_unless_told():
    """Without duration=: arrivals for FILL_HOLDS mean holds, then the beats the caller (the
    bench's --beats) measures, which the workload records as its window. Catches a default that
    ignores the hold or the beats, and a window that begins before the fill is over."""
    w = wl.generate("poisson:occupancy=0.8,hold=30", 1, slots=50, beats=400)
    fill = wl.FILL_HOLDS * 30
    assert w.source["params"]["duration"] == pytest.approx(fill + 400 * BEAT_S)
    assert w.window_s == pytest.approx((fill, fill + 400 * BEAT_S))
    assert max(c.at_s for c in w.calls) < fill + 400 * BEAT_S
    short = wl.generate("poisson:occupancy=0.8,hold=30", 1, slots=50)   # DEFAULT_BEATS
    assert short.source["params"]["duration"] == pytest.approx(fill + wl.DEFAULT_BEATS * BEAT_S)
    told = wl.generate("poisson:occupancy=0.8,hold=30,duration=100", 1, slots=50, beats=400)
    assert told.source["params"]["duration"] == 100 and told.window_s == (90, 100)
    assert wl.generate("poisson:occupancy=0.8,hold=30,duration=60", 1, slots=50).window_s is None
    assert wl.generate("poisson:rate=1,duration=60", 1).window_s is None


@pytest.mark.parametrize("spec,says", [
    ("poisson:occupancy=0,hold=120,slots=10", "0 < occupancy <= 1"),
    ("poisson:occupancy=-0.5,hold=120,slots=10", "0 < occupancy <= 1"),
    ("poisson:occupancy=1.01,hold=120,slots=10", "0 < occupancy <= 1"),
    ("poisson:occupancy=0.9,hold=0,slots=10", "hold .* must be > 0"),
    ("poisson:occupancy=0.9,hold=-3,slots=10", "hold .* must be > 0"),
    ("poisson:occupancy=0.9,rate=2,hold=120,slots=10", "rate= or occupancy=, not both"),
    ("poisson:occupancy=0.9,hold=120", "needs the node's slots"),
    ("poisson:occupancy=0.9,hold=120,slots=0", "slots=0.0 must be a whole number"),
    ("poisson:occupancy=0.9,hold=120,slots=2.5", "slots=2.5 must be a whole number"),
    ("poisson:occupancy=0.9,hold=120,call=60,slots=10", "hold and call"),
    ("poisson:rate=1,duration=60,slots=10", "only for the occupancy form"),
    ("diurnal:occupancy=0.9,peak=2,duration=60,slots=10", "occupancy= is poisson's"),
])
def test_a_bad_occupancy_spec_is_refused_with_its_reason(spec, says):
    with pytest.raises(wl.WorkloadError, match=says):
        wl.generate(spec, 0)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_workload_file_round_trips(tmp_path, suffix):
    """Catches a writer and a reader that disagree on a column or a type."""
    calls = wl.generate("poisson:rate=1,duration=60,call=20,prompt=300,tools=2,jitter=15,"
                        "loss=0.02,redials=2,after=0.5,backoff=2", 9)
    path = calls.save(tmp_path / f"calls{suffix}")
    back = wl.load(str(path))
    assert back.calls == calls.calls and back.source["kind"] == "file"
    assert back.calls[0].prompt_chars == 300 and back.calls[0].tools == 2


@pytest.mark.parametrize("text,says", [
    ("at_s,duration_s\n1,0\n", "duration_s > 0"),
    ("at_s,duration_s,colour\n1,2,red\n", "unknown field"),
    ("at_s\n1\n", "duration_s is required"),
    ("at_s,duration_s,tools\n1,2,1.5\n", "tools='1.5' is not a int"),
    ("at_s,duration_s\n", "no calls"),
    ("at_s,duration_s,loss\n1,2,1\n", "loss < 1"),
])
def test_a_bad_workload_file_names_its_line_and_fault(tmp_path, text, says):
    """Catches a bad row read as a silent default, or an error that does not say where."""
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(wl.WorkloadError, match=says):
        wl.load(str(path))


def test_a_bad_generator_spec_is_refused():
    for spec, says in [("gauss:rate=1", "not a file and not a generator"),
                       ("poisson:rate=fast,duration=9", "not a number"),
                       ("poisson:rate=1", "duration"), ("poisson:rate=1,duration=9,speed=2",
                                                        "speed")]:
        with pytest.raises(wl.WorkloadError, match=says):
            wl.generate(spec, 0)


def test_deadline_metrics_count_each_calls_late_beats_and_longest_gap():
    """Catches late beats charged to calls that were not live then, and a longest run that
    joins two runs across an on-time beat."""
    late = [False, True, True, False, True, False, False, True, True, True]
    beats = [(k * BEAT_S, 0.1 + 0.1 * x, x) for k, x in enumerate(late)]
    early = CallRecord(0, asked_s=0.0, opened_s=0.0, ended_s=5 * BEAT_S, tries=1)
    later = CallRecord(1, asked_s=0.0, opened_s=6 * BEAT_S, ended_s=None, tries=2,
                       refused=["capacity"])
    never = CallRecord(2, asked_s=1.0, tries=1, refused=["admission"])
    d = summarize([early, later, never], beats, offered_erlangs=2.0)
    assert (early.late_beats, early.longest_late_run, early.live_beats) == (3, 2, 5)
    assert (later.late_beats, later.longest_late_run, later.live_beats) == (3, 3, 4)
    assert d["blocked"] == 1 and d["blocking"] == pytest.approx(1 / 3)
    assert d["refusals_by_reason"] == {"capacity": 1, "admission": 1}
    assert d["glitch_s_per_call_hour"] == pytest.approx(6 * BEAT_S / (9 * BEAT_S / 3600))
    assert d["on_time_session_s"] == pytest.approx(3 * BEAT_S)


@pytest.mark.slow
def test_the_full_node_serves_a_workload_and_reports_every_call(tmp_path):
    """A flash crowd larger than the node's slots through the production node on virtual time:
    catches calls that vanish from the records, refusals while slots were free, a redial
    policy not followed, a call's loss not reaching the jitter buffer (no underruns), and a
    call that outlives its duration."""
    calls = wl.Workload(tuple(
        [wl.Call(at_s=0.5 + 0.01 * i, duration_s=3.0, prompt_chars=40 * i, tools=i % 2)
         for i in range(6)]
        + [wl.Call(at_s=1.0, duration_s=2.0, redials=2, redial_after_s=1.5)]
        + [wl.Call(at_s=1.2, duration_s=2.0, loss=0.3)]))
    path = calls.save(tmp_path / "crowd.csv")
    res = sim_run(tmp_path, "--sessions", "6", "--workload", str(path), "--seed", "3")
    run = res["per_run"][0]
    recs = {c["call"]: c for c in run["calls"]}
    assert sorted(recs) == list(range(8))
    assert all(not recs[i]["blocked"] for i in range(6))
    # the seventh waits for a slot: refused for capacity, redials 1.5 s later, then at 3.0 s
    # finds one freed by the first six (they end by ~3.6 s) or is blocked after two redials
    seventh = recs[6]
    assert seventh["refused"][:1] == ["capacity"] and seventh["tries"] >= 2
    assert seventh["blocked"] == (seventh["tries"] == 3 and len(seventh["refused"]) == 3)
    assert recs[7]["refused"] == ["capacity"] and recs[7]["blocked"]
    for c in run["calls"]:
        if not c["blocked"]:
            assert c["ended_s"] - c["opened_s"] == pytest.approx(
                calls.calls[c["call"]].duration_s, abs=0.2)
    d = run["deadlines"]
    assert d["calls"] == 8 and d["blocked"] == sum(c["blocked"] for c in run["calls"])
    assert run["refusals_by_reason"] == {"capacity": sum(len(c["refused"])
                                                         for c in run["calls"])}
    assert res["extra"]["workload"]["calls"] == 8


@pytest.mark.slow
def test_lost_frames_of_a_workload_call_show_as_underruns(tmp_path):
    """Catches a call's `loss` that never reaches the node: the lost frames' sequence numbers
    are skipped, so the jitter buffer must report the gaps as underruns."""
    calls = wl.Workload((wl.Call(at_s=0.2, duration_s=4.0, loss=0.3),
                         wl.Call(at_s=0.2, duration_s=4.0)))
    path = calls.save(tmp_path / "lossy.jsonl")
    res = sim_run(tmp_path, "--sessions", "2", "--workload", str(path), "--seed", "1")
    assert res["per_run"][0]["underruns"] > 5


def test_the_cli_refuses_a_bad_workload_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sim.run", "--sessions", "2", "--out",
                          str(tmp_path), "--workload", "poisson:rate=x"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "not a number" in out.stderr
    assert "Traceback" not in out.stderr
