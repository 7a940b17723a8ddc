"""`python -m wave_actors.fleet` as an operator runs it: a node per (Ray-declared) GPU, status
lines, and a drain of every node on SIGINT."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytest.importorskip("ray")
pytestmark = pytest.mark.slow          # a local Ray cluster and node processes each
ROOT = Path(__file__).resolve().parents[2]


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nodes_sharing_a_gpu_their_metrics_then_a_clean_drain_on_sigint():
    """`--nodes all --per-gpu 2` on one GPU: two nodes, each given half of it (Ray places a
    node asking a whole GPU only where one is free: a share that did not reach Ray would
    leave the second node unplaced, and its line would never come)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "wave_actors.fleet", "--nodes", "all",
                             "--fake-gpus", "1", "--per-gpu", "2", "--every", "1",
                             "--metrics-port", str(port),
                             "--", "--backend", "sim",
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
        # each node process was told its share, within which a GPU node sizes itself
        assert all(n["gpu_share"] == 0.5 for n in nodes)
        assert "free 8" in proc.stdout.readline()
        m = scrape(port)
        assert m[("wave_fleet_nodes", (("state", "alive"),))] == 2
        assert m[("wave_fleet_free_slots", ())] == 8
        for node in ("node0", "node1"):            # read from each node's own registry
            assert m[("wave_fleet_node_free_slots", (("node", node),))] == 4
            assert ("wave_fleet_node_beats_total", (("node", node),)) in m
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
    assert "3 node(s) need 3 GPUs; the cluster has 2" in done.stderr


def test_a_node_that_does_not_start_says_why():
    """Bug it catches: a node's log thrown away, so a node that fails to build (out of memory,
    a bad flag) shows only "not listening", and the operator cannot tell why."""
    done = subprocess.run([sys.executable, "-m", "wave_actors.fleet", "--nodes", "1",
                           "--fake-gpus", "1", "--", "--backend", "sim", "--no-such-flag"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "a node did not start" in done.stderr
    assert "exited with code 2 before it listened" in done.stderr
    assert "unrecognized arguments: --no-such-flag" in done.stderr


def fleet_cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "wave_actors.fleet", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def lines_until(proc: subprocess.Popen, want: str, timeout_s: float = 90) -> list[str]:
    seen, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if want in line:
            return seen
    raise AssertionError(f"{want!r} not printed; got {seen}")


def test_a_restarted_entry_point_attaches_and_no_call_is_lost():
    """On a Ray cluster the directory and nodes outlive the entry point: killed (-9) and
    started again, it attaches to them; the call placed before lives on, and a drain from
    another process (`drain NODE`) waits for it."""
    import ray

    from transports.client_events import Closed
    from transports.fleet_client import DIRECTORY, FleetClient

    ns = "wave-restart-test"
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    address = ray.get_runtime_context().gcs_address
    cmd = ["--address", address, "--namespace", ns, "--nodes", "2", "--every", "0.5", "--",
           "--backend", "sim", "--max-sessions", "2", "--workers", "0"]
    first = fleet_cli(*cmd)
    try:
        lines_until(first, "free 4")

        async def call_then_restart():
            calls = FleetClient(ray.get_actor(DIRECTORY, namespace=ns))
            c = await calls.open("kept")
            node = calls.node_of[c.id]
            first.kill()
            first.wait(10)
            again = fleet_cli(*cmd)
            try:
                seen = lines_until(again, "sessions 1")
                assert any("attached to the running fleet: node0, node1" in x for x in seen)
                assert c.closed is None and calls.lost == 0        # the call lives on
                await c.send_audio(bytes(2560))
                drain = fleet_cli("drain", node, "--address", address, "--namespace", ns)
                assert "draining, 1 call(s) live" in lines_until(drain, "draining")[-1]
                assert drain.poll() is None                         # waiting on the call
                await calls.close(c)
                assert isinstance(c.closed, Closed)
                assert drain.wait(30) == 0
                assert "drained and stopped" in drain.stdout.read()
                again.send_signal(signal.SIGINT)
                out, _ = again.communicate(timeout=60)
                assert again.returncode == 0 and node not in out.split("draining…")[-1]
            finally:
                if again.poll() is None:
                    again.kill()
            await calls.aclose()
        asyncio.run(call_then_restart())
    finally:
        if first.poll() is None:
            first.kill()
        ray.shutdown()


@pytest.mark.parametrize("bridge", ["transports.realtime", "transports.sip"])
def test_a_bridge_with_no_fleet_to_join_says_so_and_exits(bridge):
    """`--fleet auto` with no fleet to join: one line saying why, not a traceback. Where no
    Ray cluster runs, that none answers; `auto` also finds a cluster another test started here
    (Ray looks for its processes), where no fleet runs in the namespace asked for."""
    done = subprocess.run([sys.executable, "-m", bridge, "--fleet", "auto",
                           "--listen", "127.0.0.1:15099"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "WAVE_API_KEY": "k",
                                                      "WAVE_FLEET_NAMESPACE": "none-here"})
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] in (
        "error: --fleet auto: no Ray cluster answers there",
        "error: --fleet auto: no fleet runs on that Ray cluster (namespace 'none-here'); start "
        "one: python -m wave_actors.fleet --address auto -- NODE_ARGS")


def test_nodes_sharing_a_gpu_are_told_their_share_unless_the_operator_set_one():
    from wave_actors.fleet.ray_fleet import shared_node_args
    node = ["--backend", "graph"]
    assert shared_node_args(node, 1) == node
    assert shared_node_args(node, 3) == [*node, "--gpu-share", "1/3"]
    # bug caught: an operator's share in the `=` form overridden by the fleet's
    for own in (["--gpu-share", "0.3"], ["--gpu-share=0.3"]):
        assert shared_node_args([*node, *own], 2) == [*node, *own]
