"""Device check of the graph executor: parity with the eager reference model (equal tokens in fp32;
the serving precisions' deviation measured), and graph replay against the same backend run
eagerly in the serving precision (same kernels, same batches: must be equal). Prints a table;
writes JSON.

    python3 bench/graph_check.py --out $OUT/graph-check.json [--full]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu.engine.graph_executor import GraphExecutor                    # noqa: E402
from bench.harness.parity import compare, engine_run, reference_run      # noqa: E402
from wave_actors.core.contract import SessionSpec                           # noqa: E402
from wave_actors.bench.results import git_commit                                 # noqa: E402
from wave_actors.core.contract import ExecutorOptions                   # noqa: E402

SPECS = [SessionSpec("You are a helpful assistant."), SessionSpec(""),
         SessionSpec("Answer briefly.", [{"name": "lookup", "description": "d", "parameters": {}}]),
         SessionSpec("Speak French.")]


SLOTS = [4, 0, 2, 5]


def _audio(frames: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.1 * rng.standard_normal((len(SPECS), frames, 1280))).astype(np.float32)


def _backend(config: str, profile: str, frames: int, seed: int, **variant) -> GraphExecutor:
    return GraphExecutor(ExecutorOptions(max_sessions=6, profile=profile, config=config,
                                       max_context=frames + 64, seed=seed), **variant)


def _release(backend: GraphExecutor) -> None:
    backend.close()
    del backend
    torch.cuda.empty_cache()


def parity(config: str, profile: str, frames: int, seed: int = 0) -> dict:
    """The graph backend against the plain reference model (no kernels, no graphs)."""
    t0 = time.perf_counter()
    backend = _backend(config, profile, frames, seed)
    build_s = time.perf_counter() - t0
    audio = _audio(frames, seed)
    t1 = time.perf_counter()
    run, keys = engine_run(backend, SPECS, audio, SLOTS)
    engine_s = time.perf_counter() - t1
    ref = reference_run(backend.model, backend.text_codec, SPECS, audio, keys, seed)
    res = {"against": "reference model", "config": config, "profile": profile,
           "sessions": len(SPECS), "frames": frames, "build_s": round(build_s, 1),
           "engine_s": round(engine_s, 1), **compare(run, ref),
           "finite": bool(np.isfinite(run.pcm).all())}
    _release(backend)
    return res


VARIANTS = {"eager": dict(capture=False),              # same beat body, no graph
            "one stream": dict(streams=False)}          # same graph, stages in order


def same_backend(config: str, profile: str, frames: int, variant: str, seed: int = 0) -> dict:
    """The serving graph against a variant of the same backend, in the serving precision: the
    same kernels on the same batches, so every output must be equal."""
    audio, runs = _audio(frames, seed), []
    for kw in ({}, VARIANTS[variant]):
        backend = _backend(config, profile, frames, seed, **kw)
        runs.append(engine_run(backend, SPECS, audio, SLOTS)[0])
        _release(backend)
    return {"against": f"same backend, {variant}", "config": config, "profile": profile,
            "sessions": len(SPECS), "frames": frames, "build_s": 0.0, "engine_s": 0.0,
            **compare(runs[0], runs[1]), "finite": bool(np.isfinite(runs[0].pcm).all())}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="graph-check.json")
    ap.add_argument("--full", action="store_true", help="also the full model (needs an H200)")
    ap.add_argument("--frames", type=int, default=50)
    args = ap.parse_args()
    rows = [parity("tiny", "fp32", args.frames), parity("tiny", "reference", args.frames),
            same_backend("tiny", "reference", args.frames, "eager"),
            same_backend("tiny", "reference", args.frames, "one stream")]
    if args.full:
        rows += [parity("full", "reference", args.frames), parity("full", "dense", args.frames),
                 same_backend("full", "reference", args.frames, "eager"),
                 same_backend("full", "reference", args.frames, "one stream")]
    record = {"commit": git_commit(), "command": "python3 bench/graph_check.py " + " ".join(sys.argv[1:]),
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(0), "rows": rows}
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(f"{'against':25} {'config':6} {'profile':10} {'text=':>6} {'func=':>6} {'user=':>6} {'same to':>7} "
          f"{'pcm rel':>9} {'build s':>7} {'engine s':>8}")
    for r in rows:
        print(f"{r['against']:25} {r['config']:6} {r['profile']:10} {r['text_equal']:6.3f} {r['func_equal']:6.3f} "
              f"{r['user_equal']:6.3f} {r['frames_identical']:7d} {r['pcm_rel']:9.2e} "
              f"{r['build_s']:7.1f} {r['engine_s']:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
