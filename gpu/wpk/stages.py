"""The decode path's stages as IR (issue 18, stage 2), starting with perception, the head of every
beat's critical path: both frames of a beat for B sessions in one streaming step, on the plain
PyTorch path (the compiler's fusion pass maps ops onto the kernel library later).

    python -m gpu.wpk.stages [--config full] [--profile reference] [--sessions 120]

prints the perception IR's size: ops that launch, views, bytes by storage class, the memory
plan's arena against its lower bound, what `gpu.wpk.compile` makes of it (kernels, tasks,
joins, the longest chain of kernels) at the sessions given, and how many of those kernels the
task ops can run (`gpu.wpk.lower.coverage`, on the fp32 trace: the ops, not the dtypes)
(traced on the meta device: no memory, no arithmetic).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from gpu.model.config import Profile, VoiceChatConfig
from gpu.model.perception import Perception, PerceptionState, init_random, param_shapes
from gpu.wpk import memplan
from gpu.wpk.compile import compile_stage, summary as compiled_summary
from gpu.wpk.ir import Graph, Storage, symbolic, trace
from gpu.wpk.lower import coverage
from wave_actors.core.frames import FRAMES_PER_BEAT


@dataclass
class StageRun:
    """A stage ready to trace or run: `fn()` computes it on `named` tensors."""
    fn: object
    named: dict             # name → (Storage, tensor)

    def tensors(self) -> dict:
        return {k: t for k, (_, t) in self.named.items()}


def perception_stage(config: str, profile: str, batch: int, device: str = "meta",
                     slots_total: int | None = None, seed: int = 0) -> StageRun:
    """Perception's streaming step for `batch` sessions in slots 0..batch-1 (the input
    `input:slots`, which a caller may rewrite) of a state with `slots_total` slots (default
    batch + 1). Weights random (seeded) off the meta device; the same for every batch."""
    cfg = VoiceChatConfig.named(config).perception
    dtype = Profile.named(profile).compute
    model = Perception(cfg, device=device, dtype=dtype)
    if device == "meta":
        weights = {n: torch.empty(s, device="meta") for n, s in param_shapes(cfg).items()}
    else:
        weights = {n: t.to(device) for n, t in
                   init_random(cfg, torch.Generator().manual_seed(seed)).items()}
    model.load_named(weights)
    state = PerceptionState.alloc(cfg, slots_total or batch + 1, device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    windows = torch.randn(batch, FRAMES_PER_BEAT, cfg.window_cols, cfg.mel_bins,
                          generator=gen).to(device=device, dtype=dtype)
    slots = torch.arange(batch, device=device)
    named = {f"weight:{n}": (Storage.WEIGHT, p) for n, p in model.named_parameters()}
    named |= {f"weight:{n}": (Storage.WEIGHT, b) for n, b in model.named_buffers()}
    named |= {f"state:{f}": (Storage.STATE, getattr(state, f)) for f in ("k", "v", "time", "frames")}
    named |= {"input:windows": (Storage.INPUT, windows), "input:slots": (Storage.INPUT, slots)}

    def fn():
        out = model.step_frames(state, windows, slots)
        return out.enc, out.audio
    return StageRun(fn, named)


def feed_forward_halves(layer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Conformer layer's two feed-forward half-steps around its norms, the attention and
    convolution modules between them left out (what the task ops cover so far): (the
    attention's normed input, the layer's output)."""
    s = x + 0.5 * layer.feed_forward1(layer.norm_feed_forward1(x))
    u = layer.norm_self_att(s)
    s2 = s + 0.5 * layer.feed_forward2(layer.norm_feed_forward2(s))
    return u, layer.norm_out(s2)


def feed_forward_stage(config: str, rows: int, layers: int | None = None, device: str = "cpu",
                       seed: int = 0) -> StageRun:
    """Perception's first `layers` layers (default all) as `feed_forward_halves`, each layer's
    output the next one's input, over `rows` rows (a beat's frames of its sessions), fp32,
    random weights (seeded, MODEL.md §8); returns the last layer's (u, output)."""
    cfg = VoiceChatConfig.named(config).perception
    model = Perception(cfg, device=device, dtype=torch.float32)
    model.load_named({n: t.to(device) for n, t in
                      init_random(cfg, torch.Generator().manual_seed(seed)).items()})
    stack = list(model.encoder.layers)[:layers]
    x = torch.randn(rows, cfg.d_model, generator=torch.Generator().manual_seed(seed + 1)
                    ).to(device)
    named = {"input:x": (Storage.INPUT, x)}
    for i, layer in enumerate(stack):
        named |= {f"weight:{i}.{n}": (Storage.WEIGHT, p) for n, p in layer.named_parameters()}

    def fn():
        h = x
        for layer in stack:
            u, h = feed_forward_halves(layer, h)
        return u, h
    return StageRun(fn, named)


def perception_ir(config: str, profile: str, b1: int = 2, b2: int = 3) -> Graph:
    """Perception's IR with its batch symbolic (traced on the meta device at b1 and b2)."""
    g1 = trace(**_traceable(perception_stage(config, profile, b1)))
    g2 = trace(**_traceable(perception_stage(config, profile, b2)))
    return symbolic(g1, b1, g2, b2)


def _traceable(run: StageRun) -> dict:
    return {"fn": run.fn, "named": run.named}


def summary(graph: Graph, sessions: int) -> dict:
    blocks = memplan.lifetimes(graph, sessions)
    p = memplan.place(blocks)
    gb = lambda n: round(n / 1e6, 2)        # noqa: E731
    return {"sessions": sessions, "ops_launching": graph.launches(),
            "views": sum(n.view for n in graph.nodes),
            "mb": {k.value: gb(graph.bytes_of(k, sessions)) for k in Storage},
            "arena_mb": gb(p.arena), "peak_live_mb": gb(memplan.peak(blocks)),
            "plan_problems": len(memplan.check(p))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="full", choices=("full", "tiny"))
    ap.add_argument("--profile", default="reference", choices=("reference", "dense", "fp32"))
    ap.add_argument("--sessions", type=int, nargs="+", default=[120])
    ap.add_argument("--programs", type=int, default=132, help="queues: one program an SM")
    args = ap.parse_args()
    g = perception_ir(args.config, args.profile)
    for n in args.sessions:
        compiled = compile_stage(g, n, args.programs)
        concrete = trace(**_traceable(perception_stage(args.config, "fp32", n)))
        print(summary(g, n) | {"compiled": compiled_summary(compiled, g),
                               "task_ops": coverage(concrete, n)})


if __name__ == "__main__":
    main()
