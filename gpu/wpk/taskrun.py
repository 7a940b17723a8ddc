"""A task-table program (WPK.md §5.3): each program walks its queue of emitted rows
(`schedule.TaskTable.emit`), waits on each task's counter for `count × beat` signals, runs the
task's op on a flat fp32 arena (tensors are offsets into it, as the memory plan will give them),
then signals. One launch a beat, counters never reset: the beat number is the epoch.

The op library here is one op, enough to prove the walk, the waits and the arena addressing
against a PyTorch reference: `AFFINE` writes tile `t` of a layer as the previous layer's tile
plus half the previous layer's sum (so every tile of a layer needs every tile of the one
before). Real ops (the model's tiles) join as more `if op == ...` branches with `noinline`
bodies (WPK.md §3: inlined bodies grow every task's registers).

Row layout (int32): op, wait, count, signal, a0..a3; for AFFINE: a0 = the input's offset,
a1 = the output's offset, a2 = the tile, a3 unused; every layer holds `n` values.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu.wpk.schedule import NONE, OpSpec, Task, TaskTable
from gpu.wpk.sync import signal, wait_ge

AFFINE = 1
C_AFFINE = tl.constexpr(AFFINE)


@triton.jit
def task_program(rows, starts, counters, arena, beat, n, TILE: tl.constexpr,
                 BLOCK_N: tl.constexpr, IS_INTERP: tl.constexpr):
    p = tl.program_id(0)
    i = tl.load(starts + p)
    end = tl.load(starts + p + 1)
    while i < end:
        row = rows + i * 8
        op = tl.load(row)
        wait = tl.load(row + 1)
        count = tl.load(row + 2)
        sig = tl.load(row + 3)
        if wait >= 0:
            wait_ge(counters + wait, count * beat, IS_INTERP)
            tl.debug_barrier()
        if op == C_AFFINE:
            src = tl.load(row + 4)
            dst = tl.load(row + 5)
            tile = tl.load(row + 6)
            total = 0.0
            for k in range(0, n, BLOCK_N):          # registers do not grow with n
                every = k + tl.arange(0, BLOCK_N)
                total += tl.sum(tl.load(arena + src + every, mask=every < n, other=0.0), axis=0)
            idx = tile * TILE + tl.arange(0, TILE)
            x = tl.load(arena + src + idx, mask=idx < n, other=0.0)
            tl.store(arena + dst + idx, x + 0.5 * total, mask=idx < n)
        if sig >= 0:
            signal(counters + sig, IS_INTERP)
        i += 1


def affine_layers(layers: int, n: int, tile: int, queues: int) -> TaskTable:
    """`layers` AFFINE layers over an arena of `layers + 1` vectors of `n` (vector 0 the input),
    tiles dealt to `queues` queues in layer order; layer l signals counter l."""
    tiles = -(-n // tile)
    qs: list[list[Task]] = [[] for _ in range(queues)]
    k = 0
    for layer in range(layers):
        for t in range(tiles):
            wait, count = (layer - 1, tiles) if layer else (NONE, 0)
            qs[k % queues].append(Task(AFFINE, wait, count, layer, (layer * n, (layer + 1) * n, t)))
            k += 1
    ops = {AFFINE: OpSpec("affine", lambda task: [
        (0, task.args[0], task.args[0] + n),                       # the whole input layer
        (0, task.args[1] + task.args[2] * tile,
         min(task.args[1] + (task.args[2] + 1) * tile, task.args[1] + n))])}
    return TaskTable(qs, layers, [(layers + 1) * n], ops)


def affine_reference(x: torch.Tensor, layers: int) -> torch.Tensor:
    """[layers + 1, n]: the input and each layer's output, in fp32."""
    out = [x.float()]
    for _ in range(layers):
        out.append(out[-1] + 0.5 * out[-1].sum())
    return torch.stack(out)
