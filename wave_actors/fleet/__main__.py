"""`python -m wave_actors.fleet`: a node per GPU on a Ray cluster behind one directory.

    python -m wave_actors.fleet --nodes 2 -- --backend sim --max-sessions 32
    python -m wave_actors.fleet --address auto --nodes all -- --backend graph --profile dense

Everything after `--` is each node's own command line (`python -m wave_actors.node`; the fleet
sets `--bind`). Without `--address` a local Ray instance is started with the GPUs this machine
has (`--fake-gpus N` declares N for a CPU trial: Ray's resources are labels). It prints each
node's endpoint and the directory's counts every `--every` seconds; SIGINT or SIGTERM drains
every node (no new calls; live calls end; then the nodes stop).
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

import ray

from wave_actors.fleet.placement import DEFAULT, POLICIES
from wave_actors.fleet.ray_fleet import Fleet


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m wave_actors.fleet",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1",
                    help="node actors, one GPU each; all: one for every GPU of the cluster")
    ap.add_argument("--address", help="a Ray cluster to join (e.g. auto); default: start one")
    ap.add_argument("--fake-gpus", type=int, help="a local Ray instance with this many GPUs")
    ap.add_argument("--placement", choices=sorted(POLICIES), default=DEFAULT)
    ap.add_argument("--base-port", type=int,
                    help="node i binds base-port + i (default: each a free port)")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between status lines")
    ap.add_argument("--drain-timeout", type=float, default=600.0)
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, node_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    ap = _parser()
    args = ap.parse_args(ours)
    if args.nodes != "all" and not (args.nodes.isdigit() and int(args.nodes) >= 1):
        ap.error(f"--nodes is a count >= 1 or all, not {args.nodes!r}")
    if "--bind" in node_args:
        ap.error("the fleet sets each node's --bind (see --base-port)")
    if args.address:
        ray.init(address=args.address, log_to_driver=False)
    else:
        ray.init(num_gpus=args.fake_gpus, include_dashboard=False, log_to_driver=False)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    nodes = gpus if args.nodes == "all" else int(args.nodes)
    if not 1 <= nodes <= gpus:
        ray.shutdown()
        ap.error(f"{nodes} node(s) need as many GPUs; the cluster has {gpus} "
                 "(--fake-gpus N for a CPU trial)")
    fleet = Fleet(nodes, node_args, args.placement, args.base_port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        for facts in fleet.ready():
            print(json.dumps({"node": facts["name"], "endpoint": facts["endpoint"],
                              "slots": facts["slots"]}), flush=True)
        fleet.watch()
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
