"""`bench/fleet_gpu.py` on sim nodes sharing one (Ray-declared) GPU: what it reports is what
happened to the calls."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.slow          # a local Ray cluster and two node processes
ROOT = Path(__file__).resolve().parents[2]


def test_every_node_filled_then_a_kill_ends_only_its_calls(tmp_path):
    """Bugs it catches: calls placed on one node only (the directory's placement bypassed),
    calls counted from a slot count the nodes were not given,
    a reader that steals the `closed` the close waits for (every close timing out), and a
    kill whose calls never hear `node_lost` or that reaches the other node's calls."""
    out = tmp_path / "fleet.json"
    done = subprocess.run(
        [sys.executable, "bench/fleet_gpu.py", "--nodes", "2", "--per-gpu", "2",
         "--fake-gpus", "1", "--beats", "25", "--runs", "1", "--kill",
         "--out", str(out), "--", "--backend", "sim", "--workers", "0", "--max-sessions", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    run, kill = doc["runs"][0], doc["kill_run"]
    # the calls are the slots the nodes said they hold (no --slots: each node's own count)
    assert doc["slots_each"] == {"node0": 3, "node1": 3}
    assert run["failed"] == [] and run["placed"] == {"node0": 3, "node1": 3}
    assert set(run["per_node"]) == {"node0", "node1"}
    assert all(v["beats"] > 0 for v in run["per_node"].values())
    assert kill["failed"] == [] and kill["kill"]["calls_on_it"] == 3
    assert kill["kill"]["all_closed"] and kill["kill"]["codes"] == ["node_lost"]
    # how soon is the bench's to measure (a loaded runner stretches it), not the test's
    assert kill["kill"]["closed_within_s"] > 0
    assert kill["kill"]["others_with_an_error"] == 0
    assert set(kill["per_node"]) == {"node1"}
    assert doc["kill_run_survivors_late_beats"] == kill["per_node"]["node1"]["late_beats"]
    met = doc["met"]                    # each target judged from the run's own numbers
    assert met["no_late_beat"] == (doc["late_beats"] == 0)
    assert met["killed_calls_closed_in_time"] == (kill["kill"]["closed_within_s"] <= 2.0)
    assert met["other_calls_untouched"] and met["survivors_on_time"] == (
        doc["kill_run_survivors_late_beats"] == 0)
