"""The benchmark's callers in load-generator processes (wave_actors/bench/clients.py): a real-time
run through them accounts for every session, and a generator that dies ends the run with a
clear error instead of waiting for sessions that never come."""
import asyncio
import json
import time
from pathlib import Path

import pytest

from wave_actors.bench import capacity, cli
from wave_actors.bench.backend import make_executor_for
from wave_actors.bench.clients import Generators
from wave_actors.core.frames import FRAMES_PER_BEAT


@pytest.mark.slow
def test_a_real_time_run_through_two_generator_processes_accounts_for_every_session(tmp_path):
    args = cli.parse_args(["--backend", "sim", "--sessions", "5", "--beats", "12",
                             "--client-procs", "2", "--warmup-max", "8", "--out", str(tmp_path)])
    (res,) = capacity.measure(args, 5)
    assert res.windows["measured"]["beats"] == 12 and res.refusals == 0 and res.errors == 0
    assert res.beats == sum(res.windows[w]["beats"] for w in ("ramp", "measured", "drain"))
    # every session reported its `closed` stats through its generator: frames went both ways
    assert res.frames_in > 5 * 12 and res.frames_out > 5 * 12


def test_a_generator_that_dies_is_reported_while_the_run_waits():
    async def scenario() -> str:
        callers = Generators("tcp://127.0.0.1:9", 2, 2)     # nothing answers: opens hang
        try:
            callers._procs[0].terminate()
            deadline = time.monotonic() + 30
            while callers.failed() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            with pytest.raises(RuntimeError, match="exited with code"):
                await capacity._while_alive(callers, asyncio.sleep(60))
            return callers.failed()
        finally:
            callers.kill()
    assert "bench-load-0" in asyncio.run(scenario())


def test_churn_on_virtual_time_starts_new_calls_without_a_late_beat(tmp_path):
    """--churn: calls end and new ones start through the run. With 32 ms a session and 20 ms
    for a beat's start rows, four lines stay under the deadline with a start riding along
    (4 · 32 + 20 < 160): every new call opens within a few beats, none is refused, every beat
    stays on time and every session that opened is accounted for."""
    raw = json.loads((Path(__file__).parents[2] / "sim" / "costmodel.json").read_text())
    raw.update(weight_bytes_per_frame=0.0, overhead_s_per_beat=0.0, bandwidth_Bps=1e12,
               start_rows_s=0.02)
    raw["profiles"]["reference"].update(fixed_bytes=32e-3 * 1e12 / 2, bytes_per_context_frame=0.0)
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(raw))
    args = cli.parse_args(["--backend", "sim", "--sessions", "4", "--beats", "150", "--virtual",
                             "--churn", "2", "--cost-model", str(cost), "--out", str(tmp_path)])
    (res,) = capacity.measure(args, 4)
    assert res.windows["measured"]["beats"] == 150 and res.beats > 150
    assert res.late_beats == 0 and res.errors == 0 and res.refusals == 0
    assert res.opens >= 4 + 10                          # ~24 s of calls of 2 s on 4 lines
    assert res.open_p99_ms <= 4 * 160                   # a start rides the next beats
    assert min(res.trace["sessions"]) >= 1 and max(res.trace["sessions"]) <= 4
    # every frame a session heard had its output sent, but the last beat's of a call whose
    # caller hung up meanwhile
    assert res.frames_in > 0 and res.frames_out >= res.frames_in - FRAMES_PER_BEAT * res.opens


@pytest.mark.parametrize("churn", ["-1", "nan"])
def test_churn_must_be_a_mean_call_length(churn, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--backend", "sim", "--churn", churn])
    assert "--churn" in capsys.readouterr().err


@pytest.mark.slow
def test_a_generator_whose_callers_were_all_refused_does_not_end_the_run(tmp_path):
    """Bug: a load generator whose lines were all refused exited at once, and the bench aborted
    ("bench-load-3 exited with code 0 before the run ended") instead of reporting the refusal.
    Four callers, one per generator, on a node with three slots: one is refused."""
    args = cli.parse_args(["--backend", "sim", "--sessions", "4", "--beats", "12",
                             "--client-procs", "4", "--warmup-max", "8", "--out", str(tmp_path)])
    backend = make_executor_for(args, 3)
    try:
        (res,) = capacity.measure(args, 4, backend)
    finally:
        backend.close()
    assert res.windows["measured"]["beats"] == 12 and res.opens == 3 and res.refusals == 1
    assert res.refusals_by_reason == {"capacity": 1}
    assert res.live == {"offered": 4, "min": 3, "p50": 3.0, "max": 3}
    assert res.open_max_ms >= res.open_p99_ms > 0


def test_a_burst_dials_onto_the_steady_node_and_is_reported_apart(tmp_path):
    """--burst: once the first callers are steady, more dial at once; the measured beats begin
    then, so any start work they cost is in them, and their opens are reported on their own."""
    args = cli.parse_args(["--backend", "sim", "--sessions", "6", "--burst", "3", "--beats",
                             "40", "--virtual", "--out", str(tmp_path)])
    (res,) = capacity.measure(args, 6)
    assert res.opens == 6 and res.refusals == 0
    assert res.burst["sessions"] == 3 and res.burst["opened"] == 3 and res.burst["refused"] == 0
    assert 0 <= res.burst["open_p50_ms"] <= res.burst["open_p99_ms"] <= res.burst["open_max_ms"]
    assert res.burst["open_max_ms"] <= 2 * 160            # their rows ride the next beat
    assert res.live["offered"] == 9 and res.live["min"] == 6 and res.live["max"] == 9
    assert res.trace["sessions"][0] == 6                  # measured from the dial on
    with pytest.raises(SystemExit):
        cli.parse_args(["--backend", "sim", "--burst", "-1"])


def test_a_call_takes_its_audio_from_the_shared_clips():
    """Bug caught: every call drawing its own audio at `opened` (milliseconds of the
    generator's loop), which stamps a burst's `opened` one caller after another: the benchmark
    measures its own callers, not the node."""
    from wave_actors.bench.clients import CLIPS, caller_audio
    assert caller_audio(3) is caller_audio(3 + CLIPS)
    assert len({id(caller_audio(k)) for k in range(3 * CLIPS)}) == CLIPS


def test_a_workload_calls_talk_pattern_is_its_talk_and_silence():
    import numpy as np
    from wave_actors.bench.clients import talking
    from wave_actors.bench.workload import Call
    from wave_actors.core.frames import IN_RATE
    call = Call(0.0, 10.0, talk_s=1.3, silence_s=0.45)
    period = talking(call)
    t = np.arange(10 * len(period)) / IN_RATE
    want = ((t % (call.talk_s + call.silence_s)) < call.talk_s).astype(np.float32)
    got = period[np.arange(len(t)) % len(period)]
    assert (got != want).mean() < 1e-4        # the rule, up to a sample's rounding
