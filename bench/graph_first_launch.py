"""What each captured graph of a built graph executor costs at its first launch in serving and at
the launches after it: host time to launch, device time, and wall time to its end.

A CUDA graph is uploaded to the device at its first launch unless it was uploaded before. A
node uses its largest bucket's graph at once, but a smaller bucket's (or a reset, clean or copy
count's) first beat may come only when many calls hang up together; what that beat pays is
the first launch here. The executor launches each graph once at build, so its graphs' first
launches here should cost what their later ones do; a beat graph captured afresh here (`fresh`)
shows what a first launch costs when nothing launched it before.

    python3 bench/graph_first_launch.py --profile dense --sessions 128 --context 1500 \\
        --out out/first-launch.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu.engine.graph_executor import GraphExecutor                    # noqa: E402
from wave_actors.bench.provenance import stamp                         # noqa: E402
from wave_actors.core.contract import ExecutorOptions                  # noqa: E402

LAUNCHES = 3


def launches(graph: torch.cuda.CUDAGraph) -> list[dict]:
    """`LAUNCHES` launches of `graph`, each alone on an idle device."""
    out = []
    for _ in range(LAUNCHES):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        graph.replay()
        host = time.perf_counter() - t0
        b.record()
        b.synchronize()
        out.append({"host_ms": round(1e3 * host, 3), "device_ms": round(a.elapsed_time(b), 3),
                    "wall_ms": round(1e3 * (time.perf_counter() - t0), 3)})
    return out


def every_graph(ex: GraphExecutor) -> dict[str, torch.cuda.CUDAGraph]:
    """The executor's graphs by name: each bucket's beat (with each row capture), and each
    count's resets, cleans and snapshot copies."""
    graphs = {f"beat {b} rows {r}": g.graph for (b, r), g in sorted(ex.graphs.captured.items())}
    runner = ex.runner
    for name, indexed in (("resets", runner.resets.graphs), ("cleans", runner.resets.cleans),
                          ("copies", runner.snapshots.graphs)):
        graphs.update({f"{name} {n}": entry[0] for n, entry in sorted(indexed.graphs.items())})
    return {k: v for k, v in graphs.items() if v is not None}


def fresh(ex: GraphExecutor, bucket: int) -> torch.cuda.CUDAGraph:
    """The bucket's beat (no start rows) captured again on the trash rows, never launched."""
    graphs = ex.graphs
    g = graphs.on_trash(bucket, 0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=graphs.pool), torch.no_grad():
        graphs.body(g)
    return graph


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="dense")
    ap.add_argument("--config", default="full")
    ap.add_argument("--sessions", type=int, default=128)
    ap.add_argument("--context", type=int, default=1500)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    ex = GraphExecutor(ExecutorOptions(max_sessions=args.sessions, profile=args.profile,
                                       config=args.config, max_context=args.context))
    rows = {}
    named = every_graph(ex)
    top = max(b for b, _ in ex.graphs.captured)
    named.update({f"fresh beat {b}": fresh(ex, b) for b in sorted({1, top})})
    with torch.no_grad():
        for name, graph in named.items():
            rows[name] = launches(graph)
            first, later = rows[name][0]["wall_ms"], min(x["wall_ms"] for x in rows[name][1:])
            print(f"{name:24s} first {first:8.2f} ms  later {later:8.2f} ms  "
                  f"(+{first - later:.2f})", flush=True)

    def extra(names) -> dict:
        more = [rows[k][0]["wall_ms"] - min(x["wall_ms"] for x in rows[k][1:]) for k in names]
        return {"max": round(max(more), 2), "sum": round(sum(more), 2)}
    result = {"command": "python " + " ".join(sys.argv), **stamp(),
              "gpu": torch.cuda.get_device_name(0), "profile": args.profile,
              "config": args.config, "sessions": args.sessions, "context": args.context,
              "first_launch_extra_ms": {
                  "executor": extra([k for k in rows if not k.startswith("fresh")]),
                  "fresh": extra([k for k in rows if k.startswith("fresh")])},
              "graphs": rows}
    print(json.dumps(result["first_launch_extra_ms"]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    ex.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
