"""`python -m wave_actors.fleet` as an operator runs it: a node per (Ray-declared) GPU, status
lines, and a drain of every node on SIGINT."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[2]


def test_a_node_per_gpu_then_a_clean_drain_on_sigint():
    proc = subprocess.Popen([sys.executable, "-m", "wave_actors.fleet", "--nodes", "all",
                             "--fake-gpus", "2", "--every", "1", "--", "--backend", "sim",
                             "--max-sessions", "4", "--workers", "0"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        nodes, deadline = [], time.monotonic() + 90
        while len(nodes) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("{"):
                nodes.append(json.loads(line))
        assert sorted(n["node"] for n in nodes) == ["node0", "node1"]
        assert all(n["slots"] == 4 and n["endpoint"].startswith("tcp://") for n in nodes)
        assert "free 8" in proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert "node0: drained" in out and "node1: drained" in out
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_more_nodes_than_gpus_is_refused_with_the_count():
    done = subprocess.run([sys.executable, "-m", "wave_actors.fleet", "--nodes", "3",
                           "--fake-gpus", "2", "--", "--backend", "sim"], cwd=ROOT,
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 2
    assert "3 node(s) need as many GPUs; the cluster has 2" in done.stderr
