"""The commands a user runs: the node, the WAV client, the demo, the benchmark, the metrics."""
import pytest
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_tone_wav(path: Path, seconds: float, rate: int = 16000) -> None:
    t = np.arange(int(seconds * rate)) / rate
    x = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(x.tobytes())


def wait_listening(proc) -> dict:
    line = proc.stdout.readline()
    assert line, f"node exited: {proc.stderr.read()}"
    return json.loads(line)


@pytest.mark.slow
def test_node_wavclient_metrics_and_clean_sigterm(tmp_path):
    port, mport = free_port(), free_port()
    node = subprocess.Popen([PY, "-m", "wave_actors.node", "--backend", "sim", "--bind",
                             f"tcp://127.0.0.1:{port}", "--max-sessions", "2",
                             "--metrics-port", str(mport)], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        info = wait_listening(node)
        assert info["listening"] == f"tcp://127.0.0.1:{port}" and info["max_sessions"] == 2
        wav_in, wav_out = tmp_path / "in.wav", tmp_path / "reply.wav"
        write_tone_wav(wav_in, 2.0)
        t0 = time.monotonic()
        out = subprocess.run([PY, "-m", "transports.wavclient", "--connect",
                              f"tcp://127.0.0.1:{port}", "--wav", str(wav_in), "--out",
                              str(wav_out), "--pace", "4", "--tail", "1.5"],
                             cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert time.monotonic() - t0 < 30
        stats = report["stats"]
        assert stats["frames_in"] + stats["dropped"] == 25          # 2 s = 25 frames of 80 ms
        assert stats["frames_in"] >= 20 and report["errors"] == []
        with wave.open(str(wav_out)) as w:
            assert w.getframerate() == 22050 and w.getnframes() >= 22050
        body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read()
        text = body.decode()
        for name in ("wave_sessions", "wave_free_slots", "wave_beat_latency_seconds_bucket",
                     "wave_late_beats_total", "wave_underruns_total", "wave_refusals_total",
                     "wave_errors_total", "wave_dropped_total"):
            assert name in text, name
        # the one open, timed by phase in the node
        for phase in ("admit", "start", "answer"):
            assert f'wave_open_phase_seconds_count{{phase="{phase}"}} 1.0' in text, phase
        assert 'le="0.16"' in text and "session=" not in text and report["session"] not in text
        # every frame the closed session lost is in the node's totals, by where it was lost
        lost = {line.split('"')[1]: float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("wave_frames_lost_total{")}
        assert set(lost) == {"input_shed", "input_clock", "input_session", "output"}
        assert sum(lost.values()) == stats["dropped"]
    finally:
        node.send_signal(signal.SIGTERM)
        rc = node.wait(timeout=20)
    assert rc == 0
    assert "draining" in node.stdout.read()


def test_wavclient_reports_a_missing_file_clearly(tmp_path):
    out = subprocess.run([PY, "-m", "transports.wavclient", "--wav", str(tmp_path / "nope.wav")],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "nope.wav" in out.stderr


@pytest.mark.slow
def test_demo_writes_replies_and_a_summary(tmp_path):
    port = free_port()
    out = subprocess.run([PY, "-m", "wave_actors.node", "--demo", "--backend", "sim",
                          "--demo-seconds", "4", "--demo-sessions", "2", "--bind",
                          f"tcp://127.0.0.1:{port}", "--out", str(tmp_path),
                          "--gpu-share", "1/2"],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    # a share asked of a backend with no GPU is said to change nothing, not silently dropped
    assert "--gpu-share 0.5: the sim backend has no GPU to share" in out.stderr, out.stderr
    summary = json.loads(out.stdout[out.stdout.index("\n["):out.stdout.rindex("]") + 1])
    assert [s["session"] for s in summary] == ["demo-0", "demo-1"]
    for s in summary:
        assert Path(s["reply"]).is_file() and s["seconds_out"] > 2 and s["frames_in"] > 20
    assert "p99" in out.stdout and "late" in out.stdout


def test_bench_writes_json(tmp_path):
    out = subprocess.run([PY, "-m", "wave_actors.bench", "--backend", "sim", "--sessions", "6",
                          "--beats", "25", "--virtual", "--out", str(tmp_path)],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    files = list(tmp_path.glob("sim-reference-n6-*.json"))
    assert len(files) == 1
    res = json.loads(files[0].read_text())
    for key in ("backend", "profile", "context", "sessions", "runs", "beats", "late_beats",
                "p50_ms", "p99_ms", "gpu", "commit"):
        assert key in res, key
    assert res["beats"] == 25 and res["late_beats"] == 0 and res["sessions"] == 6
    # every measured beat's times, in order, for finding where a tail comes from
    trace = res["per_run"][0]["trace"]
    assert {len(v) for v in trace.values()} == {25}
    assert set(trace) == {"latency_ms", "compute_ms", "begin_ms", "wake_ms", "gc_ms",
                          "loop_cpu_ms", "returned_ms", "frames_read", "sessions", "rows",
                          "resets", "rolls", "copies"}
    # the loop's CPU a beat is real work, part of the process's (virtual time runs it anyway)
    host = res["per_run"][0]["host"]
    assert 0 < host["loop_cpu_ms"]["p50"] <= host["process_cpu_ms"]["p50"] + 0.1
    assert host["loop_cpu_us_per_session"] > 0
    assert set(trace["sessions"]) == {6}
    run = res["per_run"][0]
    assert run["opens"] == 6 and run["refusals"] == 0 and 0 <= run["open_p50_ms"] <= run["open_p99_ms"]
    # the node's share of the wait, by phase: none longer than the whole wait the callers saw
    phases = run["open_phases"]
    assert set(phases) == {"admit", "start", "answer"}
    assert all(p["max"] <= run["open_max_ms"] + 0.1 for p in phases.values())
    measured = run["windows"]["measured"]
    assert max(trace["latency_ms"]) == round(measured["max_ms"], 1) and measured["beats"] == 25
    # the headline counts every beat with a live session: the callers' ramp too
    assert run["beats"] == res["beats_all"] == sum(run["windows"][w]["beats"]
                                                  for w in ("ramp", "measured", "drain")) > 25
    assert res["per_run"][0]["backlog_ms"] == trace["wake_ms"][0] < 160   # began on schedule
    assert "behind the release schedule" not in out.stdout
    assert all(w <= b + 0.1 and b + c <= r + 0.2 and r <= lt + 0.1 for w, b, c, r, lt in
               zip(trace["wake_ms"], trace["begin_ms"], trace["compute_ms"], trace["returned_ms"],
                   trace["latency_ms"]))
    # 6 callers at 12.5 frames a second: 12 frames a beat once every one streams
    assert sorted(trace["frames_read"])[len(trace["frames_read"]) // 2] == 12
    # the modelled beat at 6 sessions and 1500 frames of context (docs/MODEL.md §5 roofline)
    assert 13.0 < res["p50_ms"] < 16.0


@pytest.mark.slow
def test_node_refuses_a_backend_it_cannot_run_with_a_clear_message():
    # Without a GPU the graph backend cannot start; with one, 100000 sessions do not fit.
    out = subprocess.run([PY, "-m", "wave_actors.node", "--backend", "graph", "--config", "full",
                          "--max-sessions", "100000", "--bind", f"tcp://127.0.0.1:{free_port()}"],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert ("needs a CUDA device" in out.stderr or "sessions fit" in out.stderr), out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_sim_run_with_jitter_makes_late_beats_that_the_bench_counts(tmp_path):
    # 110 sessions model a 71 ms beat at 1500 frames; 150% jitter pushes some past 160 ms.
    out = subprocess.run([PY, "-m", "sim.run", "--sessions", "110", "--beats", "60",
                          "--jitter", "1.5", "--out", str(tmp_path)],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(next(tmp_path.glob("sim-reference-n110-*.json")).read_text())
    assert res["virtual"] is True and res["beats"] == 60
    assert res["command"].startswith("python -m sim.run --sessions 110 --beats 60 --jitter 1.5")
    assert 0 < res["measured"]["late_beats"] < 60 and res["p99_ms"] > 160
    assert res["late_beats"] >= res["measured"]["late_beats"]


@pytest.mark.slow
def test_bench_says_when_its_measured_beats_began_behind_schedule(tmp_path):
    """A node that never gets on time (a 1 s beat at 8 sessions): the warm-up gives up, and the
    bench says how far behind the measured beats began instead of leaving it to the trace.
    The default (guarded) policy still starts every caller: its beats are late anyway."""
    raw = json.loads((ROOT / "sim" / "costmodel.json").read_text())
    raw["overhead_s_per_beat"] = 1.0
    cost = tmp_path / "slow.json"
    cost.write_text(json.dumps(raw))
    out = subprocess.run([PY, "-m", "wave_actors.bench", "--backend", "sim", "--sessions", "8",
                          "--beats", "6", "--virtual", "--warmup-max", "4", "--cost-model",
                          str(cost), "--out", str(tmp_path)],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    run = json.loads(next(tmp_path.glob("sim-reference-n8-*.json")).read_text())["per_run"][0]
    assert run["backlog_ms"] > 160 and run["windows"]["measured"]["late_beats"] == 6
    assert run["late_beats"] > 6                         # the late warm-up beats count too
    assert run["backlog_ms"] == run["trace"]["wake_ms"][0]
    assert "behind the release schedule" in out.stdout and "after 4 beats of warm-up" in out.stdout


@pytest.mark.slow
def test_demo_with_session_workers_and_an_engine_process(tmp_path):
    """`--workers 1`: the calls' actors in a worker, the clock and executor in the engine
    process; the demo's calls are heard and answered as in one process, and the node exits 0
    (every process stopped)."""
    port = free_port()
    out = subprocess.run([PY, "-m", "wave_actors.node", "--demo", "--backend", "sim", "--workers",
                          "1", "--demo-seconds", "4", "--demo-sessions", "2", "--bind",
                          f"tcp://127.0.0.1:{port}", "--out", str(tmp_path)],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout[out.stdout.index("\n["):out.stdout.rindex("]") + 1])
    for s in summary:
        assert Path(s["reply"]).is_file() and s["seconds_out"] > 2 and s["frames_in"] > 20


@pytest.mark.slow
def test_node_with_workers_says_why_its_engine_could_not_start():
    # The executor is built in the engine process: its failure reaches the operator as one line.
    out = subprocess.run([PY, "-m", "wave_actors.node", "--backend", "graph", "--config", "full",
                          "--workers", "1", "--max-sessions", "100000", "--bind",
                          f"tcp://127.0.0.1:{free_port()}"],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=180)
    assert out.returncode != 0
    assert "engine" in out.stderr, out.stderr
    assert ("needs a CUDA device" in out.stderr or "sessions fit" in out.stderr), out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_bench_with_workers_reports_each_process(tmp_path):
    out = subprocess.run([PY, "-m", "wave_actors.bench", "--backend", "sim", "--sessions", "6",
                          "--beats", "25", "--workers", "2", "--client-procs", "1", "--out",
                          str(tmp_path)],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    res = json.loads(next(tmp_path.glob("sim-reference-n6-*.json")).read_text())
    run = res["per_run"][0]
    assert run["opens"] == 6 and run["frames_in"] > 0 and res["beats"] == 25
    procs = run["host"]["processes"]
    assert procs["workers"] == 2
    # each figure is measured, not left out: the engine beats, the workers and front serve
    assert procs["engine_cpu_ms_per_beat"] > 0 and procs["front_cpu_ms_per_beat"] > 0
    assert procs["worker_cpu_us_per_session_beat"] > 0
    # the records are the engine's clock's: its loop's CPU, no more than its process's
    host = run["host"]
    assert 0 < host["loop_cpu_ms"]["p50"] <= host["process_cpu_ms"]["p50"] + 0.1
    assert host["before_after_ms"]["p50"] >= 0


def test_bench_refuses_workers_on_virtual_time(tmp_path):
    out = subprocess.run([PY, "-m", "wave_actors.bench", "--backend", "sim", "--workers", "1",
                          "--virtual", "--out", str(tmp_path)],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "real time only" in out.stderr, out.stderr


def test_workers_default_to_none_on_a_small_machine_and_scale_with_cores():
    # A small machine keeps one process (the demo, CI); a big one gets a worker a 4 cores.
    from wave_actors.node.cli import auto_workers, parse_args
    assert [auto_workers(c) for c in (None, 1, 2, 4, 7)] == [0, 0, 0, 0, 0]
    assert [auto_workers(c) for c in (8, 12, 16, 64)] == [2, 3, 4, 4]
    assert parse_args(["--workers", "3"]).workers == 3
    assert parse_args([]).workers == auto_workers(os.cpu_count())
    with pytest.raises(SystemExit):
        parse_args(["--workers", "-1"])


def test_a_gpu_backend_serves_the_full_model_and_sizes_its_slots_by_default():
    """Bug it catches: `--backend graph` with no other option served the 1 M-parameter tiny
    model (the cpu backend's default) and only the bench ever asked a GPU node to size itself."""
    from wave_actors.node.cli import parse_args, slots_asked
    graph = parse_args(["--backend", "graph"])
    assert graph.config == "full" and slots_asked(graph) == 0 and graph.snapshot_mb == -1
    cpu = parse_args(["--backend", "cpu"])
    assert cpu.config == "tiny" and slots_asked(cpu) > 0
    assert parse_args(["--backend", "graph", "--config", "tiny"]).config == "tiny"
    with pytest.raises(SystemExit):
        parse_args(["--snapshot-mb", "-5"])


def test_the_node_warms_the_empty_prompt_and_each_one_it_is_given(tmp_path, capsys):
    """Bugs it catches: a warm prompt the protocol would refuse taken anyway (the node would
    start a session no caller could open), one given twice warmed twice, or --no-warm beside
    prompts to warm silently choosing one."""
    from wave_actors.core.contract import SessionSpec
    from wave_actors.node.cli import parse_args
    assert parse_args([]).warm == (SessionSpec(),)
    assert parse_args(["--no-warm"]).warm == ()
    listed = tmp_path / "prompts.json"
    listed.write_text(json.dumps([{"instructions": "Book rooms.",
                                   "tools": [{"name": "book", "parameters": {}}]},
                                  {"instructions": "Be brief."}]))
    got = parse_args(["--warm-prompt", "Be brief.", "--warm-prompts", str(listed)]).warm
    assert got == (SessionSpec(), SessionSpec("Be brief."),
                   SessionSpec("Book rooms.", [{"name": "book", "parameters": {}}]))
    for bad, says in ((["--no-warm", "--warm-prompt", "x"], "choose one"),
                      (["--warm-prompts", str(tmp_path / "none.json")], "No such file"),
                      (["--warm-prompts", str(listed.with_suffix(".bad"))], "No such file")):
        with pytest.raises(SystemExit):
            parse_args(bad)
        assert says in capsys.readouterr().err
    for entry, says in (({"instructions": 5}, "instructions must be a str"),
                        ({"tools": [{"no": "name"}]}, "tools must be a list"),
                        ({"instructions": "x", "voice": "alloy"}, "only"),
                        ("text", "only")):
        listed.write_text(json.dumps([entry]))
        with pytest.raises(SystemExit):
            parse_args(["--warm-prompts", str(listed)])
        err = capsys.readouterr().err
        assert "warm prompt 1: " in err and says in err, err


def test_a_demo_whose_calls_fail_exits_non_zero_and_says_why(tmp_path):
    """Bug it catches: `make run` exited 0 with "Task exception was never retrieved" when a
    demo call failed (an open that timed out on a slow machine): the node drained and called it
    a success. A WAV the demo cannot read fails it the same way, at once."""
    port = free_port()
    out = subprocess.run([PY, "-m", "wave_actors.node", "--demo", "--backend", "sim",
                          "--demo-seconds", "2", "--demo-wav", str(tmp_path / "nope.wav"),
                          "--bind", f"tcp://127.0.0.1:{port}", "--out", str(tmp_path)],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert "demo: a call failed" in out.stderr and "nope.wav" in out.stderr
    assert "never retrieved" not in out.stderr
