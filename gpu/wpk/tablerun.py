"""A compiled stage played on the CPU as the device would run it (issue 18, stage 2): the table's
programs interleaved as any co-resident programs may be (`schedule.run`), each kernel's IR ops
run when its last tile does, and every activation living in the memory plan's arena at its
planned offset. A kernel run before what it reads is written, or two live activations given the
same bytes, change the stage's outputs: so the stage's outputs equal to the stage run mean the
fusion, the dependences and the plan hold together. Numerics per tile are not what this checks
(the kernels run whole, in PyTorch); the order and the memory are.
"""
from __future__ import annotations

import random

import torch

from gpu.wpk.compile import OP_CODE, Compiled
from gpu.wpk.ir import Graph, Runner
from gpu.wpk.schedule import run


class _Arena:
    def __init__(self, graph: Graph, compiled: Compiled, device: torch.device):
        self.graph, self.offsets = graph, compiled.plan.offsets
        self.bytes = torch.zeros(max(compiled.plan.arena, 1), dtype=torch.uint8, device=device)

    def place(self, vid: int, t: torch.Tensor) -> torch.Tensor:
        """`t` (an op's fresh result) copied to its storage's planned bytes; the arena's view."""
        v = self.graph.values[vid]
        at = self.offsets.get(v.storage)
        if at is None:
            return t
        size = t.untyped_storage().nbytes()
        base = self.bytes[at:at + size].view(t.dtype)
        # as_strided's offset counts from the arena's start, not the slice's (offsets are
        # aligned, so whole elements)
        view = torch.as_strided(base, t.shape, t.stride(), at // t.element_size()
                                + t.storage_offset())
        view.copy_(t)
        return view


def play(graph: Graph, compiled: Compiled, tensors: dict, batch: int | None = None,
         seed: int = 0, beats: int = 1, device: str = "cpu") -> list[torch.Tensor]:
    """The stage's outputs, played from the table in a random order (`seed`) on `tensors`
    (on `device`, where a traced op's device arguments are moved too)."""
    runner = Runner(graph, tensors, batch, device)
    arena = _Arena(graph, compiled, runner.device)
    pending = [k for k, n in enumerate(graph.nodes) if n.view]
    done_tiles: dict[int, int] = {}

    def run_kernel(i: int) -> None:
        for k in compiled.kernels[i].nodes:
            # views launch nothing: run each once its base exists, before the op that may use it
            for view in [v for v in pending if v < k]:
                if runner.ready(view):      # in order: a view of a view finds its base bound
                    runner.run(view)
                    pending.remove(view)
            runner.run(k, arena.place)

    def on_task(beat, at, task):
        if task.op == OP_CODE["join"]:
            return
        i = task.args[0]
        done_tiles[i] = done_tiles.get(i, 0) + 1
        if done_tiles[i] == compiled.kernels[i].tiles:
            run_kernel(i)

    rng = random.Random(seed)
    with torch.no_grad():
        run(compiled.table, beats, order=lambda can: rng.choice(can), on_task=on_task)
        for view in [v for v in pending if runner.ready(v)]:
            runner.run(view)
    return runner.outputs()
