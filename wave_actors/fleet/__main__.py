"""`python -m wave_actors.fleet`: a node per GPU on a Ray cluster behind one directory.

    python -m wave_actors.fleet --nodes 2 -- --backend sim --max-sessions 32
    python -m wave_actors.fleet --address auto --nodes all -- --backend graph --profile dense
    python -m wave_actors.fleet drain node1 --address auto

Everything after `--` is each node's own command line (`python -m wave_actors.node`; the fleet
sets `--bind` and `--metrics-port`). Without `--address` a local Ray instance is started with
the GPUs this machine has (`--fake-gpus N` declares N for a CPU trial: Ray's resources are
labels). It prints each node's endpoint and the directory's counts every `--every` seconds;
`--metrics-port` serves Prometheus metrics per node and fleet-wide. SIGINT or SIGTERM drains
every node (no new calls; live calls end; then the nodes stop); `drain NODE` drains one.

On a Ray cluster (`--address`) the directory and the nodes outlive the entry point: started
again after a crash, it attaches to them and no live call is lost.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

import ray

from transports.fleet_client import DIRECTORY, NAMESPACE
from wave_actors.fleet.metrics import FleetCollector, serve
from wave_actors.fleet.placement import DEFAULT, POLICIES
from wave_actors.fleet.ray_fleet import Fleet

FLEET_SETS = ("--bind", "--metrics-port")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m wave_actors.fleet",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1",
                    help="node actors, one GPU each (--per-gpu: a share of one); all: one for "
                         "every GPU of the cluster (--per-gpu for each)")
    ap.add_argument("--per-gpu", type=int, default=1,
                    help="nodes sharing each GPU, each given 1/N of it: in Ray's accounting "
                         "and as the node's --gpu-share (it sizes its slots within 1/N of the "
                         "GPU's memory and beat)")
    ap.add_argument("--address", help="a Ray cluster to join (e.g. auto); default: start one")
    ap.add_argument("--fake-gpus", type=int, help="a local Ray instance with this many GPUs")
    ap.add_argument("--namespace", default=NAMESPACE,
                    help="the Ray namespace of the fleet's actors (two fleets, two names)")
    ap.add_argument("--placement", choices=sorted(POLICIES), default=DEFAULT)
    ap.add_argument("--base-port", type=int,
                    help="node i binds base-port + i (default: each a free port)")
    ap.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between status lines")
    ap.add_argument("--drain-timeout", type=float, default=600.0)
    return ap


def _drain_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m wave_actors.fleet drain",
                                 description="Take a node of a running fleet out of "
                                             "placement; the fleet stops it once its calls end.")
    ap.add_argument("node", help="the node's name (node0, node1, ...)")
    ap.add_argument("--address", default="auto", help="the fleet's Ray cluster")
    ap.add_argument("--namespace", default=NAMESPACE)
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds to wait for its calls to end (they are not cut)")
    return ap


def drain_main(argv: list[str]) -> int:
    args = _drain_parser().parse_args(argv)
    ray.init(address=args.address, log_to_driver=False, configure_logging=False)
    try:
        try:
            directory = ray.get_actor(DIRECTORY, namespace=args.namespace)
        except ValueError:
            print(f"no fleet runs in namespace {args.namespace!r} at {args.address}",
                  file=sys.stderr)
            return 1
        nodes = ray.get(directory.stats.remote())["nodes"]
        if args.node not in nodes:
            print(f"no node {args.node!r}; the fleet has {sorted(nodes)}", file=sys.stderr)
            return 1
        live = ray.get(directory.drain.remote(args.node))
        print(f"{args.node}: draining, {live} call(s) live", flush=True)
        deadline, last = time.monotonic() + args.timeout, live
        while args.node in ray.get(directory.stats.remote())["nodes"]:
            if time.monotonic() > deadline:
                print(f"{args.node}: {last} call(s) still live after {args.timeout:.0f} s; "
                      "it stays draining", file=sys.stderr)
                return 3
            if (left := ray.get(directory.live_on.remote(args.node))) != last:
                print(f"{args.node}: {left} call(s) live", flush=True)
                last = left
            time.sleep(0.5)
        print(f"{args.node}: drained and stopped", flush=True)
        return 0
    finally:
        ray.shutdown()


def _needs(nodes: int, per_gpu: int) -> str:
    gpus = -(-nodes // per_gpu)
    share = f" at {per_gpu} a GPU" if per_gpu > 1 else ""
    return f"{nodes} node(s){share} need {gpus} GPU{'s' * (gpus > 1)}"


def _start(args, ap, node_args: list[str]) -> Fleet:
    running = Fleet.attach(args.namespace) if args.address else None
    if running is not None:
        print(f"attached to the running fleet: {', '.join(running.names)}", flush=True)
        return running
    gpus = int(ray.cluster_resources().get("GPU", 0))
    room = gpus * args.per_gpu
    nodes = room if args.nodes == "all" else int(args.nodes)
    if not 1 <= nodes <= room:
        ray.shutdown()
        ap.error(f"{_needs(nodes, args.per_gpu)}; the cluster has {gpus} "
                 "(--fake-gpus N for a CPU trial)")
    return Fleet.start(nodes, node_args, args.placement, args.base_port,
                       namespace=args.namespace, detached=bool(args.address),
                       per_gpu=args.per_gpu)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["drain"]:
        return drain_main(argv[1:])
    ours, node_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    ap = _parser()
    args = ap.parse_args(ours)
    if args.nodes != "all" and not (args.nodes.isdigit() and int(args.nodes) >= 1):
        ap.error(f"--nodes is a count >= 1 or all, not {args.nodes!r}")
    for flag in FLEET_SETS:
        if flag in node_args:
            ap.error(f"the fleet sets each node's {flag}")
    if args.per_gpu < 1:
        ap.error(f"--per-gpu is a count of nodes a GPU holds (>= 1), not {args.per_gpu}")
    if args.fake_gpus is not None and args.nodes != "all" \
            and int(args.nodes) > args.fake_gpus * args.per_gpu:
        ap.error(f"{_needs(int(args.nodes), args.per_gpu)}; the cluster has {args.fake_gpus} "
                 "(--fake-gpus)")
    if args.address:
        ray.init(address=args.address, log_to_driver=False)
    else:
        ray.init(num_gpus=args.fake_gpus, include_dashboard=False, log_to_driver=False)
    try:
        fleet = _start(args, ap, node_args)
        ready = fleet.ready()
    except ray.exceptions.RayError as exc:
        # the node's own last words are in the actor's error (`node_actor.py`)
        print(f"fleet: a node did not start: {exc}", file=sys.stderr)
        ray.shutdown()
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        for facts in ready:
            print(json.dumps({"node": facts["name"], "endpoint": facts["endpoint"],
                              "slots": facts["slots"], "gpu_share": facts["gpu_share"]}),
                  flush=True)
        fleet.watch()
        if args.metrics_port:
            serve(FleetCollector(lambda: fleet.last_stats, lambda: dict(fleet.readings),
                                 fleet.totals), args.metrics_port)
        while not stop.wait(args.every):
            s = ray.get(fleet.directory.stats.remote())
            print(f"sessions {s['sessions']} | free {s['free_slots']} | placed "
                  f"{s['placements']} | closed {s['closes']} | lost {s['lost_sessions']} | "
                  f"refused {s['refusals']}", flush=True)
        print("draining…", flush=True)
        for name in list(fleet.nodes):
            left = fleet.drain(name, args.drain_timeout)
            print(f"{name}: drained" + (f", {left} call(s) still live at the timeout"
                                        if left else ""), flush=True)
    finally:
        fleet.close()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
