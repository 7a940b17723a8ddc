"""A task-table program (WPK.md §5.3): each program walks its queue of emitted rows
(`schedule.TaskTable.emit`), waits on each task's counter for `count × beat` signals, runs the
task's op on a flat fp32 arena (tensors are offsets into it, as the memory plan gives them),
then signals. One launch a beat, counters never reset: the beat number is the epoch.

Row layout (int32): op, wait, count, signal, a0..a3. The ops:

- `AFFINE` (a probe of the walk): a0 = the input's offset, a1 = the output's offset, a2 = the
  tile; writes tile `t` of a layer as the previous layer's tile plus half the previous layer's
  sum (every tile of a layer needs every tile of the one before); every layer holds `n`.
- The library's kernels as task ops, their arguments in an argument table (`args`, int32 rows
  of `ARGS` words; a0 = the record, a1 = the tile):
  - `GEMM`: y[M, N] = act(x[M, K] @ w[N, K]ᵀ + b), a tile BLOCK_M × BLOCK_N of y; record x, w,
    b (-1: none), y, M, N, K, act (0 none, 1 SiLU);
  - `ADD_LN`: s = x + r · alpha (r = -1: s = x), y = LayerNorm(s) · γ + β over rows of D, a
    tile of BLOCK_M rows; record x, r, γ, β, s (-1: not kept), y, M, D; alpha is `alpha_q`
    / 2¹⁶ (the table is int32), eps a constexpr.
  Each body is a `noinline` function (WPK.md §3: inlined bodies grow every task's registers).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from gpu.wpk.schedule import NONE, OpSpec, Task, TaskTable
from gpu.wpk.sync import signal, wait_ge

AFFINE, GEMM, ADD_LN = 1, 2, 3
C_AFFINE, C_GEMM, C_ADD_LN = tl.constexpr(AFFINE), tl.constexpr(GEMM), tl.constexpr(ADD_LN)
ARGS = 9                    # int32 words an argument record
C_ARGS = tl.constexpr(ARGS)
# Tile shapes of the library ops (module constants: a noinline body takes no constexpr
# arguments in Triton 3.6's compiler).
GEMM_TILE_M, GEMM_TILE_N, GEMM_TILE_K = 16, 32, 16
LN_TILE_M, LN_MAX_D, LN_EPS = 4, 64, 1e-5
C_GM, C_GN, C_GK = (tl.constexpr(v) for v in (GEMM_TILE_M, GEMM_TILE_N, GEMM_TILE_K))
C_LM, C_LD, C_EPS = (tl.constexpr(v) for v in (LN_TILE_M, LN_MAX_D, LN_EPS))
ALPHA_ONE = 1 << 16         # alpha_q of alpha = 1


@triton.jit
def _record(rec):
    """An argument record's words, in order."""
    return (tl.load(rec), tl.load(rec + 1), tl.load(rec + 2), tl.load(rec + 3), tl.load(rec + 4),
            tl.load(rec + 5), tl.load(rec + 6), tl.load(rec + 7), tl.load(rec + 8))


@triton.jit(noinline=True)
def _gemm_tile(arena, rec, tile):
    x, w, b, y, m_rows, n_cols, k_dim, act, _ = _record(rec)
    tiles_n = (n_cols + C_GN - 1) // C_GN
    rm = (tile // tiles_n) * C_GM + tl.arange(0, C_GM)
    rn = (tile % tiles_n) * C_GN + tl.arange(0, C_GN)
    acc = tl.zeros([C_GM, C_GN], tl.float32)
    for k0 in range(0, k_dim, C_GK):
        rk = k0 + tl.arange(0, C_GK)
        a = tl.load(arena + x + rm[:, None] * k_dim + rk[None, :],
                    mask=(rm[:, None] < m_rows) & (rk[None, :] < k_dim), other=0.0)
        bt = tl.load(arena + w + rn[None, :] * k_dim + rk[:, None],
                     mask=(rn[None, :] < n_cols) & (rk[:, None] < k_dim), other=0.0)
        acc += tl.sum(a[:, :, None] * bt[None, :, :], axis=1)    # fp32 FMAs, no tensor cores
    if b >= 0:
        acc += tl.load(arena + b + rn, mask=rn < n_cols, other=0.0)[None, :]
    if act == 1:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(arena + y + rm[:, None] * n_cols + rn[None, :], acc,
             mask=(rm[:, None] < m_rows) & (rn[None, :] < n_cols))


@triton.jit(noinline=True)
def _add_ln_tile(arena, rec, tile):
    x, r, gamma, beta, s_out, y, m_rows, d, alpha_q = _record(rec)
    alpha = alpha_q.to(tl.float32) / 65536.0
    rm = tile * C_LM + tl.arange(0, C_LM)
    rd = tl.arange(0, C_LD)
    mask = (rm[:, None] < m_rows) & (rd[None, :] < d)
    at = rm[:, None] * d + rd[None, :]
    v = tl.load(arena + x + at, mask=mask, other=0.0)
    if r >= 0:
        v += alpha * tl.load(arena + r + at, mask=mask, other=0.0)
    if s_out >= 0:
        tl.store(arena + s_out + at, v, mask=mask)
    mean = tl.sum(v, axis=1) / d
    c = tl.where(mask, v - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(c * c, axis=1) / d + C_EPS)
    g = tl.load(arena + gamma + rd, mask=rd < d, other=0.0)
    bb = tl.load(arena + beta + rd, mask=rd < d, other=0.0)
    tl.store(arena + y + at, c * rstd[:, None] * g[None, :] + bb[None, :], mask=mask)


@triton.jit
def task_program(rows, starts, counters, arena, args, beat, n, TILE: tl.constexpr,
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
        if op == C_GEMM:
            _gemm_tile(arena, args + tl.load(row + 4) * C_ARGS, tl.load(row + 5))
        if op == C_ADD_LN:
            _add_ln_tile(arena, args + tl.load(row + 4) * C_ARGS, tl.load(row + 5))
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


@dataclass
class Block:
    """A task table over library ops, its argument records, and where its tensors lie in the
    arena (name → (offset, shape))."""
    table: TaskTable
    args: np.ndarray                    # int32 [records, ARGS]
    layout: dict
    arena: int                          # elements

    def view(self, arena: torch.Tensor, name: str) -> torch.Tensor:
        at, shape = self.layout[name]
        return arena[at:at + math.prod(shape)].view(shape)


def ffn_block(m: int, d: int, h: int, queues: int) -> Block:
    """A Conformer feed-forward half-step as library task ops over `m` rows (the sessions):
    u = LN₁(x); y = LN₂(x + ½ · (SiLU(u W₁ᵀ + b₁) W₂ᵀ + b₂)), the residual sum kept in `s`.
    Four kernels, one counter each; every tile of a kernel waits for all tiles of the one
    before; tiles dealt round-robin to `queues` queues in kernel order."""
    shapes = {"x": (m, d), "w1": (h, d), "b1": (h,), "w2": (d, h), "b2": (d,), "g1": (d,),
              "be1": (d,), "g2": (d,), "be2": (d,), "u": (m, d), "h1": (m, h), "h2": (m, d),
              "s": (m, d), "y": (m, d)}
    layout, at = {}, 0
    for name, shape in shapes.items():
        layout[name] = (at, shape)
        at += math.prod(shape)
    if d > LN_MAX_D:
        raise ValueError(f"add + layer norm rows of {d} > LN_MAX_D = {LN_MAX_D}")
    o = {name: off for name, (off, _) in layout.items()}
    gemm_m, gemm_n, ln_m = GEMM_TILE_M, GEMM_TILE_N, LN_TILE_M
    records = [
        (ADD_LN, -(-m // ln_m), [o["x"], -1, o["g1"], o["be1"], -1, o["u"], m, d, 0]),
        (GEMM, -(-m // gemm_m) * -(-h // gemm_n), [o["u"], o["w1"], o["b1"], o["h1"], m, h, d, 1, 0]),
        (GEMM, -(-m // gemm_m) * -(-d // gemm_n), [o["h1"], o["w2"], o["b2"], o["h2"], m, d, h, 0, 0]),
        (ADD_LN, -(-m // ln_m), [o["x"], o["h2"], o["g2"], o["be2"], o["s"], o["y"], m, d,
                                 ALPHA_ONE // 2]),
    ]
    qs: list[list[Task]] = [[] for _ in range(queues)]
    k = 0
    for i, (op, tiles, _rec) in enumerate(records):
        for t in range(tiles):
            wait, count = (i - 1, records[i - 1][1]) if i else (NONE, 0)
            qs[k % queues].append(Task(op, wait, count, i, (i, t)))
            k += 1
    args = np.array([rec for *_, rec in records], np.int32)

    def whole(task):                  # the validator's ranges: the tensors a tile may touch
        return [(0, 0, at)]
    ops = {GEMM: OpSpec("gemm", whole), ADD_LN: OpSpec("add_layer_norm", whole)}
    return Block(TaskTable(qs, len(records), [at], ops), args, layout, at)


def ffn_reference(block: Block, arena: torch.Tensor, eps: float = LN_EPS) -> dict:
    """The same half-step in PyTorch (fp32) from the arena's inputs: u, h1, h2, s, y."""
    v = lambda name: block.view(arena, name)          # noqa: E731
    d = v("x").shape[1]
    u = F.layer_norm(v("x"), (d,), v("g1"), v("be1"), eps)
    h1 = F.silu(u @ v("w1").T + v("b1"))
    h2 = h1 @ v("w2").T + v("b2")
    s = v("x") + 0.5 * h2
    return {"u": u, "h1": h1, "h2": h2, "s": s, "y": F.layer_norm(s, (d,), v("g2"), v("be2"), eps)}
