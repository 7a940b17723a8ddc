"""Per-stage device time of one frame as CUDA-graph replays, at several batch sizes: where the
beat goes, stage by stage, against docs/MODEL.md §5's roofline (the README's "what bounds it").

Each stage (mel, perception, RNNT, thinker, talker, codec) is captured as its own graph over the
previous stage's static outputs, so a replay times exactly that stage's kernels with no launch
gaps from Python. Perception runs as the engine runs it, both frames of a beat in one step, and
is reported per frame (half that step). Contexts are pre-filled to `--context` frames (lengths only: the work of a
frame does not depend on the cached values). A line fit over the batch sizes gives each stage's
fixed cost (weights, launches) and its cost per session.

    python3 bench/graph_stages.py --sessions 8,32,64 --context 1500 [--profile reference]
        [--kernels 64]   # also print the top kernels of each stage at 64 sessions (eager)
        [--beat]         # also time whole beats: stages on one stream against several
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu.engine.graph.beat_streams import StreamedBeat                # noqa: E402
from gpu.engine.decode_ops import TritonDecodeOps, install            # noqa: E402
from gpu.model.config import Profile, VoiceChatConfig                 # noqa: E402
from gpu.model.talker.state import TalkerInputs                       # noqa: E402
from wave_actors.core.text import BOS                                   # noqa: E402
from gpu.model.voicechat import VoiceChat                             # noqa: E402
from gpu.model.voicechat_weights import load_dtype, random_weights_on  # noqa: E402
from wave_actors.bench.results import git_commit                               # noqa: E402

CUDNN_OFF = False          # --cudnn-off: the convolutions as the graph backend ran them before
STAGES = ("mel", "perception", "rnnt", "thinker", "talker", "codec")
# Stages the engine runs once a beat for both frames: timed that way, reported per frame (/2).
PER_BEAT = {"perception": 2}


def stage_fns(model, state, slots, audio, frame):
    """The frame as six closures; each reads the previous one's outputs from `box`."""
    box = {}
    cudnn = lambda: torch.backends.cudnn.flags(enabled=not CUDNN_OFF)   # noqa: E731

    def mel():
        box["window"] = model.mel.step(state.mel, audio, slots).window

    def perception():          # both frames of a beat in one step, as the engine runs it
        with cudnn():
            windows = torch.stack([box["window"]] * PER_BEAT["perception"], 1)
            box["heard"] = model.perception.step_frames(state.perception, windows, slots).frame(0)

    def rnnt():
        box["asr"] = model.rnnt.step(state.rnnt, box["heard"].enc, slots)

    def thinker():
        box["th"] = model.thinker.step(state.thinker, box["heard"].audio, state.text_prev[slots],
                                       state.func_prev[slots], slots)

    def talker():
        th = box["th"]
        noise = model.noise(0, slots, frame)
        idle = ~(state.speaking[slots] | (th.text == BOS))
        box["spoken"] = model.talker.step(state.talker, TalkerInputs(th.text, noise.uniforms,
                                                                     noise.normals, idle), slots)

    def codec():
        with cudnn():
            box["pcm"] = model.codec.step(state.codec, box["spoken"].codec_codes, slots)
    return dict(zip(STAGES, (mel, perception, rnnt, thinker, talker, codec))), box


def beat_fns(model, state, slots, audio2, frame) -> dict:
    """A whole beat (two frames, as the graph backend runs it): stages in order on one stream,
    and spread over streams (gpu/engine/graph/beat_streams.py)."""
    streamed = StreamedBeat(model, slots.device)
    forced = torch.full((len(slots), 2), -1, device=slots.device)
    noise_of = lambda f: model.noise(0, slots, frame + f)       # noqa: E731
    emit = lambda f, o: None                                     # noqa: E731

    def serial():
        model.frames(state, audio2, slots, noise_of, forced, emit)

    def streams():
        streamed.run(state, audio2, slots, noise_of, forced, emit)
    return {"beat one stream": serial, "beat streams": streams}


def capture_stages(fns, pool) -> dict:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            for f in fns.values():
                f()
    torch.cuda.current_stream().wait_stream(side)
    graphs = {}
    for name, f in fns.items():
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, pool=pool), torch.no_grad():
                f()
        except Exception as e:
            raise RuntimeError(f"capturing {name!r} failed") from e
        graphs[name] = g
    return graphs


def replay_ms(g, reps: int) -> float:
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2 * reps)]
    for i in range(reps):
        ev[2 * i].record()
        g.replay()
        ev[2 * i + 1].record()
    torch.cuda.synchronize()
    return float(np.median([ev[2 * i].elapsed_time(ev[2 * i + 1]) for i in range(reps)]))


def top_kernels(fns, rows: int) -> dict:
    out = {}
    for name, f in fns.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p, \
                torch.no_grad():
            f()
            torch.cuda.synchronize()
        evs = sorted(p.key_averages(), key=lambda e: -e.device_time_total)[:rows]
        total = sum(e.device_time_total for e in p.key_averages())
        out[name] = {"total_us": round(total, 1), "top": [
            [e.key[:90], e.count, round(e.device_time_total, 1)] for e in evs]}
    return out


def fit(ns: list[int], ms: list[float]) -> tuple[float, float]:
    slope, fixed = np.polyfit(np.asarray(ns, float), np.asarray(ms, float), 1)
    return round(float(fixed), 3), round(float(slope), 4)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", default="8,32,64")
    ap.add_argument("--context", type=int, default=1500)
    ap.add_argument("--profile", default="reference")
    ap.add_argument("--config", default="full")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--kernels", type=int, default=0, help="sessions for the kernel table (0: none)")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--out", default="")
    ap.add_argument("--cudnn-off", action="store_true")
    ap.add_argument("--beat", action="store_true",
                    help="also time whole two-frame beats, one stream against several")
    args = ap.parse_args()
    global CUDNN_OFF
    CUDNN_OFF = args.cudnn_off
    ns = [int(x) for x in args.sessions.split(",")]
    cfg, prof, dev = VoiceChatConfig.named(args.config), Profile.named(args.profile), torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = prof.tf32
    torch.backends.cudnn.allow_tf32 = prof.tf32
    t0 = time.perf_counter()
    model = VoiceChat(cfg, prof, dev)
    model.load(random_weights_on(cfg, dev, 0, load_dtype(cfg, prof)))
    install(model, TritonDecodeOps())
    n_max = max(ns + [args.kernels])
    # Positions restart at `context` for every batch size, so the caches need room only for what
    # one size's replays add. Unused capacity past a head's positions slows the talker's
    # attention by a third (bench/results/attn-layout-h200.json): keep it small, as the engine does.
    headroom = (1 + (4 if args.beat else 0)) * (args.reps + 4) + 16
    state = model.alloc_state(n_max, args.context + headroom, 8)
    state.reset(torch.arange(n_max, device=dev))

    def rewind() -> None:
        state.thinker.length[:] = args.context
        state.talker.position[:] = args.context + cfg.talker.n_warmup
    print(f"built in {time.perf_counter() - t0:.1f} s", flush=True)
    res = {"command": "python3 bench/graph_stages.py " + " ".join(sys.argv[1:]),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "commit": git_commit(),
           "profile": args.profile, "config": args.config, "context": args.context,
           "sessions": ns, "stage_ms": {}, "frame_ms": {}}
    for n in ns:
        rewind()
        pool = torch.cuda.graph_pool_handle()        # one per size: freed with its graphs
        slots = torch.arange(n, device=dev)
        audio = 0.05 * torch.randn(n, 1280, device=dev)
        frame = torch.full((n,), 3, device=dev)
        fns, _ = stage_fns(model, state, slots, audio, frame)
        graphs = capture_stages(fns, pool)
        res["stage_ms"][n] = {k: round(replay_ms(g, args.reps) / PER_BEAT.get(k, 1), 3)
                              for k, g in graphs.items()}
        res["frame_ms"][n] = round(sum(res["stage_ms"][n].values()), 3)
        if n == args.kernels:            # kernel times inside the replays (eager ones differ)
            res["graph_kernels"] = {"sessions": n, "stages": top_kernels(
                {k: g.replay for k, g in graphs.items()}, args.rows)}
        print(n, res["frame_ms"][n], res["stage_ms"][n], flush=True)
        del graphs, fns
        if args.beat:
            fns = beat_fns(model, state, slots, 0.05 * torch.randn(n, 2, 1280, device=dev), frame)
            for name, f in fns.items():       # one pool each: both at once ran out at 120 sessions
                torch.cuda.empty_cache()
                graphs = capture_stages({name: f}, torch.cuda.graph_pool_handle())
                res.setdefault("beat_ms", {}).setdefault(n, {})[name] = round(
                    replay_ms(graphs[name], args.reps), 3)
                del graphs
            print(n, "beat", res["beat_ms"][n], flush=True)
            del fns
        torch.cuda.synchronize()
    if len(ns) > 1:
        res["fit_fixed_ms_per_session_ms"] = {
            k: fit(ns, [res["stage_ms"][n][k] for n in ns]) for k in STAGES}
        res["fit_frame"] = fit(ns, [res["frame_ms"][n] for n in ns])
        print("fit (fixed ms, ms/session) per frame:", res["fit_fixed_ms_per_session_ms"],
              res["fit_frame"], flush=True)
        if args.beat:
            res["fit_beat"] = {k: fit(ns, [res["beat_ms"][n][k] for n in ns])
                               for k in res["beat_ms"][ns[0]]}
            print("fit (fixed ms, ms/session) per beat:", res["fit_beat"], flush=True)
    if args.kernels:
        rewind()
        n = args.kernels
        slots = torch.arange(n, device=dev)
        fns, _ = stage_fns(model, state, slots, 0.05 * torch.randn(n, 1280, device=dev),
                           torch.full((n,), 3, device=dev))
        with torch.no_grad():
            for f in fns.values():
                f()
        res["kernels"] = {"sessions": n, "stages": top_kernels(fns, args.rows)}
        for how in ("kernels", "graph_kernels"):
            for name, v in res.get(how, {"stages": {}})["stages"].items():
                print(f"-- {name} at {n}: {v['total_us'] / 1000:.2f} ms device time "
                      f"({'eager' if how == 'kernels' else 'graph replay'})")
                for row in v["top"]:
                    print(f"   {row[2] / 1000:7.3f} ms  x{row[1]:<4} {row[0]}")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
