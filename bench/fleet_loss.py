"""The fleet on a local Ray cluster of sim nodes, measured: capacity (N nodes take N × one
node's slots, refusals only past them), a drain (calls dropped), and node loss (from a node
actor's kill to the directory forgetting its slots, and to each of its callers reading
`error node_lost` and `closed`), over several kills.

    python bench/fleet_loss.py --nodes 4 --slots 8 --kills 5 --out bench/results/fleet-cpu.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np
import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transports.client_events import Closed, Error, Refused     # noqa: E402
from transports.fleet_client import FleetClient                 # noqa: E402
from wave_actors.bench.provenance import stamp                   # noqa: E402
from wave_actors.fleet.ray_fleet import Fleet                    # noqa: E402


async def fill(calls: FleetClient, n: int, tag: str) -> tuple[list, int]:
    opened, refused = [], 0
    for i in range(n):
        try:
            opened.append(await calls.open(f"{tag}-{i}"))
        except Refused:
            refused += 1
    return opened, refused


async def ended_at(call) -> tuple[float, str | None]:
    """When the call read `closed`, and the code of the `error` before it (None: none)."""
    code = None
    while True:
        event = await call.next_event(timeout=30.0)
        if isinstance(event, Error):
            code = event.code
        if isinstance(event, Closed):
            return time.time(), code


async def one_kill(fleet: Fleet, calls: FleetClient, slots: int, k: int) -> dict:
    opened, _ = await fill(calls, slots * len(fleet.nodes), f"kill{k}")
    victim = calls.node_of[opened[0].id]
    on_victim = [c for c in opened if calls.node_of.get(c.id) == victim]
    seen = len(fleet.lost_events)
    t0 = time.time()
    ray.kill(fleet.nodes[victim], no_restart=False)
    ends = await asyncio.gather(*(ended_at(c) for c in on_victim))
    while len(fleet.lost_events) == seen:
        await asyncio.sleep(0.01)
    others = [c for c in opened if c not in on_victim]
    untouched = all(c.closed is None for c in others)
    for c in others:
        await calls.close(c)
    while True:                         # until it rejoined, under a new incarnation
        nodes = ray.get(fleet.directory.health.remote())["nodes"]
        back, alive = nodes.get(victim, (None, False))
        if alive:
            break
        await asyncio.sleep(0.1)
    while getattr(fleet.readings.get(victim), "events_mark", (None,))[0] != back:
        await asyncio.sleep(0.05)           # and the watch read it: its next death is heard
    return {"node": victim, "calls_on_it": len(on_victim),
            "directory_forgot_s": round(fleet.lost_events[-1][1] - t0, 3),
            "callers_closed_s": [round(t - t0, 3) for t, _ in ends],
            "codes": sorted({c for _, c in ends}), "others_untouched": untouched,
            "others": len(others)}


async def measure(fleet: Fleet, slots: int, kills: int) -> dict:
    calls = FleetClient(fleet.directory)
    n = len(fleet.nodes)
    opened, refused = await fill(calls, n * slots + 3, "cap")
    capacity = {"nodes": n, "slots_each": slots, "opened": len(opened), "refused": refused}
    for c in opened:
        await calls.close(c)
    loss = [await one_kill(fleet, calls, slots, k) for k in range(kills)]
    name = fleet.names[-1]
    opened, _ = await fill(calls, slots * n, "drain")
    mine = [c for c in opened if calls.node_of[c.id] == name]
    draining = asyncio.get_running_loop().run_in_executor(None, fleet.drain, name, 60.0)
    await asyncio.sleep(1.0)
    late_open, late_refused = await fill(calls, 2, "while-draining")
    for c in opened + late_open:
        await calls.close(c)
    left = await draining
    await calls.aclose()
    closed = [t for k in loss for t in k["callers_closed_s"]]
    return {"capacity": capacity, "kills": loss,
            "callers_closed_s": {"p50": float(np.median(closed)), "max": float(max(closed))},
            "drain": {"node": name, "calls_on_it": len(mine), "dropped": left,
                      "placed_on_it_while_draining": sum(
                          calls.node_of.get(c.id) == name for c in late_open)}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    ray.init(num_cpus=2, num_gpus=args.nodes, include_dashboard=False, log_to_driver=False)
    fleet = Fleet.start(args.nodes, ["--backend", "sim", "--max-sessions", str(args.slots),
                                     "--workers", "0"])
    try:
        fleet.ready()
        fleet.watch()
        result = asyncio.run(measure(fleet, args.slots, args.kills))
    finally:
        fleet.close()
        ray.shutdown()
    doc = {"command": "python bench/fleet_loss.py " + " ".join(sys.argv[1:] if argv is None
                                                              else argv),
           "commit": stamp()["commit"], "dirty": stamp()["provenance"].get("dirty"), **result}
    print(json.dumps(doc, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
