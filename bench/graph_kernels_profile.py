"""Which GPU kernels one frame of the full model spends its time in (eager, fast path on), at
B sessions and a pre-filled context: torch.profiler's table, top rows by device time.

    python3 bench/graph_kernels_profile.py --sessions 32 --context 1500
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu.engine.decode_ops import TritonDecodeOps, install            # noqa: E402
from gpu.model.config import Profile, VoiceChatConfig                 # noqa: E402
from gpu.model.voicechat import VoiceChat                             # noqa: E402
from gpu.model.voicechat_weights import load_dtype, random_weights_on  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--context", type=int, default=1500)
    ap.add_argument("--profile", default="reference")
    ap.add_argument("--rows", type=int, default=30)
    args = ap.parse_args()
    cfg, prof, dev = VoiceChatConfig.full(), Profile.named(args.profile), torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    model = VoiceChat(cfg, prof, dev)
    model.load(random_weights_on(cfg, dev, 0, load_dtype(cfg, prof)))
    install(model, TritonDecodeOps())
    n = args.sessions
    state = model.alloc_state(n, args.context + 8, 8)
    slots = torch.arange(n, device=dev)
    state.reset(slots)
    state.thinker.length[:] = args.context
    state.talker.position[:] = args.context + cfg.talker.n_warmup
    audio = 0.05 * torch.randn(n, 1280, device=dev)
    forced = torch.full((n,), -1, device=dev)

    def frame(t):
        model.step(state, audio, slots, model.noise(0, slots, torch.full((n,), t, device=dev)),
                   forced)
    for t in range(2):
        frame(t)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        frame(2)
        torch.cuda.synchronize()
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
