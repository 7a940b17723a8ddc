"""`python -m chaos.run --short` passes: the node and both bridges, as real subprocesses on real
sockets, survive fuzzing of every public surface while victims stream beside it.

Bugs caught: a node or bridge that dies on malformed input (`crashes`); a victim's session ended
by someone else's traffic: a fuzzer closing or resuming it, a client taking its routing
identity, a shared connection dropped, or a TCP reset under it that the client cannot resume
from (`sessions_lost`); input frames a victim sent that the node neither heard nor counted as
dropped in its `closed` stats (`frames_unaccounted`); audio a victim got out of order
(`out_of_order`); a fuzzer that cannot run (it once imported a name a refactor had moved, and
every WebSocket round failed unnoticed: `rounds_failed`); a chaos run whose exit status hides
any of these; calls coming and going beside them that end without `closed` (`churn_failed`).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_short_chaos_run_passes_with_zero_figures(tmp_path):
    done = subprocess.run([sys.executable, "-m", "chaos.run", "--short", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=280)
    report = done.stdout[-4000:] + done.stderr[-4000:]
    out = tmp_path / "chaos-short.json"
    assert out.exists(), report
    data = json.loads(out.read_text())
    figures = data["chaos"]
    assert figures["crashes"] == 0, data["processes"]
    assert figures["sessions_lost"] == 0, data["victims"]
    assert figures["frames_unaccounted"] == 0, data["victims"]
    assert figures["out_of_order"] == 0, data["victims"]
    assert figures["rounds_failed"] == 0, data["notes"]
    churn = data["churn"]
    assert figures["churn_failed"] == 0, churn
    assert churn["calls"] > churn["lines"] and churn["closed"] == churn["opened"], churn
    assert all(data["fuzzers"][k]["rounds"] for k in ("zmq", "ws")), data["fuzzers"]
    assert figures["messages_tried"] > 0 and figures["errors_answered"] > 0, data["fuzzers"]
    assert done.returncode == 0, report
    assert data["command"].startswith("python -m chaos.run --short") and data["commit"]
