"""Teacher-forced fidelity of a serving precision profile against the fp32 reference, per stage
(bench/harness/fidelity.py says what it measures, fidelity_forcing.py how it forces). Builds both
models with the same random weights of the config's real shapes on the device, installs the
engine's Triton decode ops in the tested one, prints a per-quantity table and writes JSON.

    python3 bench/fidelity.py --config full --profile dense --sessions 8 --frames 32 \\
        --out bench/results/fidelity-dense-h200.json

Device: cuda if available, else the CPU (there the kernels run in Triton's interpreter, slowly:
pass --no-kernels for the plain PyTorch tested model). The commit comes from git, or on a
copied tree from its manifest (`python -m wave_actors.bench.provenance write` before copying).

Seen on one H200 (torch 2.11, triton 3.6; full config, 8 sessions x 32 frames, 70 GB peak):
25 s (reference) and 14 s (dense) a run, Triton compilation included. rel_l2: perception and
thinker 1.4-1.9e-2 (bf16), talker 1.3e-3 (TF32) / 1.6e-3 (bf16 KV), RNNT 3e-4, codec 1e-2 with
rel_max 0.12 (TF32 matmuls; the same without the kernels, 2e-5 in the fp32 profile with them);
thinker top-1 on margin > 1e-2·max rows 99.0% (its rel_max, 1.85e-2, exceeds that bound).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Triton reads TRITON_INTERPRET when it is imported: decide before torch is.
if not (Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np                                                        # noqa: E402
import torch                                                              # noqa: E402

from bench.harness.fidelity import build_pair, measure, table               # noqa: E402
from gpu.model.config import Profile, VoiceChatConfig                    # noqa: E402


def git_commit() -> str:
    from wave_actors.bench.provenance import provenance
    return provenance()["commit"]


def save(path: str, result: dict) -> None:
    """Written whole or not at all (a run killed mid-write leaves the last good one)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(out)


def read_speech(path: str) -> torch.Tensor:
    """An audio file's samples as fp32 mono at 16 kHz (the wavclient's reader: channels
    averaged, a clear error for a file it cannot read)."""
    import soxr
    from transports.wavclient import read_audio
    mono, rate = read_audio(path)
    if rate != 16000:
        mono = soxr.resample(mono, rate, 16000)
    return torch.from_numpy(np.ascontiguousarray(mono, dtype=np.float32))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="tiny", choices=["tiny", "full"])
    ap.add_argument("--profile", default="dense",
                    help="tested profile: reference, dense, dense-ssm16, dense-ssm16-sr, "
                         "dense-compact (or fp32, fp32-dense)")
    ap.add_argument("--against", default=None,
                    help="compare with this serving profile (the one the tested profile is an "
                         "option on, e.g. dense for dense-ssm16) instead of the fp32 reference")
    ap.add_argument("--window", type=int, default=1,
                    help="curves over the call in windows of this many frames (long calls)")
    ap.add_argument("--thinker-only", action="store_true",
                    help="stop each frame after the thinker: for an option that changes nothing "
                         "after it (dense-ssm16), a long call in a fraction of the time")
    ap.add_argument("--speech", default=None, metavar="WAV",
                    help="the users say this (mono; resampled to 16 kHz), again and again "
                         "with pauses, instead of noise: e.g. assets/demo_user.wav")
    ap.add_argument("--plot", default=None, help="PNG of the curves over the call (matplotlib)")
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-kernels", action="store_true", help="test the plain PyTorch model")
    ap.add_argument("--chain", action="store_true",
                    help="continuous stage inputs from the tested model (errors add up); tokens stay forced")
    ap.add_argument("--out", default=None, help="JSON path (default: print only)")
    args = ap.parse_args(argv)
    command = " ".join(shlex.quote(a) for a in [sys.argv[0]] + (sys.argv[1:] if argv is None else argv))

    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)            # tiny shapes: one thread beats contending ones
    cfg, profile = VoiceChatConfig.named(args.config), Profile.named(args.profile)
    t0 = time.perf_counter()
    against = Profile.named(args.against) if args.against else None
    model_ref, model_test = build_pair(cfg, profile, device, args.seed,
                                       kernels=not args.no_kernels, against=against)
    build_s = time.perf_counter() - t0
    every = max(1, args.frames // 20)

    def progress(done: int, seconds: float, partial) -> None:
        if done % every < args.window:
            print(f"  {done}/{args.frames} frames, {seconds:.0f} s", flush=True)
            if args.out:            # a run cut short still leaves what it measured
                save(args.out, {**partial(), **stamp})
    speech = None if args.speech is None else read_speech(args.speech)
    stamp = dict(command=command, commit=git_commit(), build_s=round(build_s, 2),
                 speech=args.speech,
                 device_name=(torch.cuda.get_device_name(device) if device.type == "cuda"
                              else "cpu"),
                 torch=torch.__version__)
    res = measure(model_ref, model_test, args.sessions, args.frames, args.seed, chain=args.chain,
                  prompt_len=args.prompt_len, window=args.window, progress=progress,
                  thinker_only=args.thinker_only, speech=speech)
    res.update(stamp)
    if device.type == "cuda":
        res["max_memory_gb"] = round(torch.cuda.max_memory_allocated(device) / 1e9, 2)
    print(f"fidelity {res['config']} {res['profile']} vs {res['reference_profile']} on "
          f"{res['device_name']}: {args.sessions} sessions x {args.frames} frames, kernels "
          f"{res['kernels']}, chain {args.chain}; build {build_s:.1f} s, measure {res['seconds']:.1f} s")
    print(table(res))
    for name, k in res["kl"].items():
        print(f"KL {name:15} mean {k['mean']:.3e}  max {k['max']:.3e} nats")
    if args.plot:
        from bench.fidelity_plot import plot
        plot([res], args.plot)
        print(f"wrote {args.plot}")
    if args.out:
        save(args.out, res)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
