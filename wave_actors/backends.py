"""Backend registry: name -> constructed backend. GPU backends import torch lazily, so the node
and the simulator run on machines without it."""
from __future__ import annotations

from dataclasses import dataclass

from wave_actors.backend import Backend
from wave_actors.clocks import Clock

NAMES = ("sim", "cpu", "graph")


@dataclass(frozen=True)
class BackendOptions:
    max_sessions: int = 8
    profile: str = "reference"          # MODEL.md §4 precision profile
    config: str = "tiny"                # model size for the cpu backend: tiny | full
    max_context: int = 1500             # frames of context each slot is sized for
    context_offset: int = 0             # sim: pretend sessions already hold this much context
    cost_model: str | None = None       # sim: JSON file of cost-model parameters
    checkpoint: str | None = None       # safetensors file with the real tensor names
    tokenizer: str | None = None        # tokenizer.json of the text tokenizer
    seed: int = 0
    context_hold: int = 0               # bench: a session at max_context steps back this many
                                        # frames and runs on, instead of going silent
    beat_wait: str = "poll"             # graph: how the loop learns a beat is done (poll | thread)


def make_backend(name: str, opts: BackendOptions, clock: Clock | None = None) -> Backend:
    if name == "sim":
        from sim.backend import SimBackend
        from sim.costmodel import CostModel
        cost = CostModel.load(opts.cost_model, opts.profile)
        return SimBackend(opts.max_sessions, cost, clock, opts.context_offset, opts.seed,
                          context_hold=opts.context_hold)
    if name == "cpu":
        from gpu.engine.cpu_backend import CpuBackend
        return CpuBackend(opts)
    if name == "graph":
        from gpu.engine.graph_backend import GraphBackend
        return GraphBackend(opts)
    raise ValueError(f"unknown backend {name!r}; choose one of {NAMES}")
