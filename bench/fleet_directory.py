"""What the fleet's directory costs as fleets grow: its own CPU a call in process, and a
directory actor on a local Ray cluster driven by concurrent clients (placements and closes a
second, and each placement's round trip), at several fleet sizes. The fleet a directory can
carry follows: each node of S slots at occupancy u with calls of mean length h places S·u/h
calls a second; closes come batched, one message a bridge each watch period, beside the
bridge's `health` poll.

    python bench/fleet_directory.py --nodes 4 64 1000 --out bench/results/fleet-directory.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wave_actors.bench.provenance import stamp                   # noqa: E402
from wave_actors.fleet.directory import Directory                # noqa: E402
from wave_actors.fleet.placement import POLICIES                 # noqa: E402
from transports.fleet_client import WATCH_S, FleetClient         # noqa: E402
from wave_actors.fleet.directory_actor import DirectoryActor         # noqa: E402

SLOTS = 300


def in_process(nodes: int, policy: str, calls: int, occupancy: float) -> float:
    """µs of the directory's own CPU a call (a placement or a close), the fleet held at
    `occupancy` so placement scans a realistic set of open nodes."""
    d = Directory(policy, seed=1)
    for i in range(nodes):
        d.join(f"n{i}", f"tcp://n{i}:1", SLOTS)
    live = [d.place().session for _ in range(int(nodes * SLOTS * occupancy))]
    rng = random.Random(2)
    t = time.perf_counter()
    for _ in range(calls):
        j = rng.randrange(len(live))
        d.closed(live[j])
        live[j] = d.place().session
    return 1e6 * (time.perf_counter() - t) / (2 * calls)


async def actor_load(actor, clients: int, seconds: float) -> dict:
    """`clients` callers placing calls for `seconds` through one `FleetClient` (a bridge: its
    placements asked while one is in flight go in one message), their calls closed as its watch
    closes them: in one `closed_many` a watch period."""
    bridge = FleetClient(actor)
    lat: list[float] = []
    placed: list[str] = []
    closes = 0
    stop = time.perf_counter() + seconds

    async def caller(k: int) -> None:
        n = 0
        while time.perf_counter() < stop:
            n += 1
            t = time.perf_counter()
            placed.append((await bridge.place(f"c{k}-{n}"))["session"])
            lat.append(time.perf_counter() - t)

    async def closer() -> None:
        nonlocal closes
        while time.perf_counter() < stop:
            await asyncio.sleep(WATCH_S)
            ended, placed[:] = placed[:], []
            await actor.closed_many.remote(ended)
            closes += 1
    t0 = time.perf_counter()
    await asyncio.gather(closer(), *(caller(k) for k in range(clients)))
    wall = time.perf_counter() - t0
    ms = np.array(lat) * 1e3
    return {"placements_per_s": len(lat) / wall,
            "messages_per_s": (bridge.place_messages + closes) / wall,
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


def on_ray(nodes: int, clients: int, seconds: float) -> dict:
    """The actor's calls a second. Its own work a call is `in_process`'s (O(log nodes)), far
    below Ray's round trip, so the fleet is not filled first; `health` grows with the nodes."""
    actor = DirectoryActor.remote("most_free", 1)
    # slots enough that no placement is refused between two closes (a refusal is cheaper)
    ray.get([actor.join.remote(f"n{i}", f"tcp://n{i}:1", 10 ** 6) for i in range(nodes)])
    load = asyncio.run(actor_load(actor, clients, seconds))
    t = time.perf_counter()
    for _ in range(50):
        ray.get(actor.health.remote())
    load["health_ms"] = 1e3 * (time.perf_counter() - t) / 50
    ray.kill(actor)
    return load


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[4, 64, 1000])
    ap.add_argument("--clients", type=int, default=8,
                    help="concurrent callers, through one bridge's FleetClient")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--occupancy", type=float, default=0.9)
    ap.add_argument("--hold", type=float, default=120.0, help="mean call length, seconds")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    per_node = SLOTS * args.occupancy / args.hold             # placements a second a node
    rows = []
    try:
        for n in args.nodes:
            row = {"nodes": n, "needed_placements_per_s": n * per_node,
                   "in_process_us": {p: in_process(n, p, 20000, args.occupancy)
                                     for p in sorted(POLICIES)}}
            row["actor"] = on_ray(n, args.clients, args.seconds)
            row["nodes_one_actor_carries"] = int(row["actor"]["placements_per_s"] / per_node)
            rows.append(row)
            print(f"{n:5d} nodes | needs {row['needed_placements_per_s']:6.0f}/s | in process "
                  + " ".join(f"{p} {us:6.1f} µs" for p, us in row["in_process_us"].items())
                  + f" | actor {row['actor']['placements_per_s']:5.0f} placements/s p99 "
                  f"{row['actor']['p99_ms']:.2f} ms, health {row['actor']['health_ms']:.2f} ms"
                  f" | carries {row['nodes_one_actor_carries']} nodes", flush=True)
    finally:
        ray.shutdown()
    s = stamp()
    doc = {"command": "python bench/fleet_directory.py " + " ".join(
        sys.argv[1:] if argv is None else argv), "commit": s["commit"],
        "dirty": s["provenance"].get("dirty"), "slots_per_node": SLOTS,
        "occupancy": args.occupancy, "hold_s": args.hold, "clients": args.clients,
        "cpus": 2, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
