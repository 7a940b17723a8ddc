"""Where a beat's time goes on the device: session start beats, live beats (whole `_compute` and
the graph replay alone), and each stage of one frame run eagerly with the fast kernels.

    python3 bench/graph_profile.py --sessions 8 --context 1500 [--config full] [--profile reference]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu.engine.graph_executor import GraphExecutor, bucket_for        # noqa: E402
from wave_actors.core.text import BOS                                     # noqa: E402
from gpu.model.talker import TalkerInputs                              # noqa: E402
from wave_actors.core.contract import SessionSpec                             # noqa: E402
from wave_actors.core.beat_driver import BeatDriver                             # noqa: E402
from wave_actors.core.contract import ExecutorOptions                     # noqa: E402


def stage_times(model, state, slots, audio) -> dict:
    """One frame, stage by stage, synchronising between stages (ms)."""
    out, t = {}, time.perf_counter()

    def mark(name):
        nonlocal t
        torch.cuda.synchronize()
        now = time.perf_counter()
        out[name] = round(1000 * (now - t), 2)
        t = now
    with torch.no_grad():
        mark("start")
        mel = model.mel.step(state.mel, audio, slots); mark("mel")
        heard = model.perception.step(state.perception, mel.window, slots); mark("perception")
        asr = model.rnnt.step(state.rnnt, heard.enc, slots); mark("rnnt")
        th = model.thinker.step(state.thinker, heard.audio, state.text_prev[slots],
                                state.func_prev[slots], slots); mark("thinker")
        noise = model.noise(0, slots, torch.zeros_like(slots))
        idle = ~(state.speaking[slots] | (th.text == BOS))
        spoken = model.talker.step(state.talker, TalkerInputs(th.text, noise.uniforms, noise.normals, idle), slots)
        mark("talker")
        model.codec.step(state.codec, spoken.codec_codes, slots); mark("codec")
    out.pop("start")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--context", type=int, default=1500)
    ap.add_argument("--config", default="full")
    ap.add_argument("--profile", default="reference")
    ap.add_argument("--beats", type=int, default=6)
    ap.add_argument("--out", default="graph-profile.json")
    args = ap.parse_args()
    n = args.sessions
    t0 = time.perf_counter()
    b = GraphExecutor(ExecutorOptions(max_sessions=n, profile=args.profile, config=args.config,
                                    max_context=args.context + 2 * args.beats + 64,
                                    context_offset=args.context))
    res = {"build_s": round(time.perf_counter() - t0, 1), "sessions": n, "context": args.context,
           "config": args.config, "profile": args.profile}
    print("built", res, flush=True)
    driver = BeatDriver(b)
    for s in range(n):
        driver.open(s, SessionSpec("You are a helpful assistant."))
    start = []

    async def beats():
        while not all(driver.ready(s) for s in range(n)):
            t = time.perf_counter()
            await driver.beat()
            start.append(round(1000 * (time.perf_counter() - t), 1))
        audio = np.zeros(driver.inp.audio.shape, np.float32)
        audio[:n] = 0.05 * np.random.default_rng(0).standard_normal(audio[:n].shape)
        live = []
        for _ in range(args.beats):
            t = time.perf_counter()
            await driver.beat(audio)
            live.append(round(1000 * (time.perf_counter() - t), 1))
        return live
    live = asyncio.run(beats())
    res["start_beats_ms"] = start
    res["live_beats_ms"] = live
    g = b._graphs[bucket_for(n, b.max_sessions), 0]
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = []
    for _ in range(5):
        ev0.record(); g.graph.replay(); ev1.record(); torch.cuda.synchronize()
        reps.append(round(ev0.elapsed_time(ev1), 2))
    res["replay_ms"] = reps
    slots = torch.arange(n, device="cuda")
    audio = torch.randn(n, 1280, device="cuda") * 0.05
    stage_times(b.model, b.state, slots, audio)
    res["eager_stage_ms"] = stage_times(b.model, b.state, slots, audio)
    res["finite"] = bool(np.isfinite(driver.out.pcm[:n]).all())
    print(json.dumps(res), flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
