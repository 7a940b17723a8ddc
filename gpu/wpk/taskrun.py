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
  - `GEMM`: y[M, N] = scale · act(x[M, K] @ w[N, K]ᵀ + b), a tile BLOCK_M × BLOCK_N of y, with
    `tl.dot` (tensor cores); record x, w, b (-1: none), y, M, N, K, act (0 none, 1 SiLU),
    scale_q (scale = scale_q / 2¹⁶, as ADD_LN's alpha), splits. With splits S > 1 the K
    range is cut in S (split-K: a small N still makes enough tiles, and each tile's serial
    K loop is S times shorter) and split s writes its partial product to y + s·M·N (scaled;
    the bias on split 0; no activation: it does not distribute over the sum), which a
    consumer sums. w is an offset
    into `weights`, a second arena whose dtype the launch picks: bf16 weights put x's tile in
    bf16 too (the model's perception runs its matmuls in bf16, accumulating in fp32); fp32
    weights run in full fp32 (`ieee`, not TF32), which the interpreter tests compare at 1e-5;
  - `ADD_LN`: s = x + r · alpha (r = -1: s = x), y = LayerNorm(s) · γ + β over rows of D, a
    tile of BLOCK_M rows; record x, r, γ, β, s (-1: not kept), y, M, D, alpha_q (alpha =
    alpha_q / 2¹⁶: the table is int32), r's splits (r is the sum of that many M × D partials,
    a split-K GEMM's, in order), then x's layout (inner, s0, s1, sd: element j of row i at
    (i // inner)·s0 + (i % inner)·s1 + j·sd; inner 0: dense rows of D); eps a constexpr.
  - The rest of a stage's ops, `EW`, `SOFTMAX`, `BGEMM` and `CONV`: `gpu.wpk.taskops`.
  Each body is a `noinline` function (WPK.md §3: inlined bodies grow every task's registers).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from gpu.wpk import taskops as X
from gpu.wpk.schedule import NONE, OpSpec, Task, TaskTable
from gpu.wpk.sync import interp, signal, wait_ge

AFFINE, GEMM, ADD_LN = 1, 2, 3
C_AFFINE, C_GEMM, C_ADD_LN = tl.constexpr(AFFINE), tl.constexpr(GEMM), tl.constexpr(ADD_LN)
ALPHA_ONE = 1 << 16         # alpha_q (scale_q) of 1
C_ONE = tl.constexpr(ALPHA_ONE)
ARGS = 52                   # int32 words an argument record: the widest op's (EW's 49)
C_ARGS = tl.constexpr(ARGS)
# Tile shapes of the library ops (module constants: a noinline body takes no constexpr
# arguments in Triton 3.6's compiler). `WAVE_WPK_GEMM_TILE=M,N,K` overrides the GEMM's for a
# process (how bench/stage2_device.py compares tile shapes); tl.dot needs each ≥ 16.
GEMM_TILE_M, GEMM_TILE_N, GEMM_TILE_K = (
    int(v) for v in os.environ.get("WAVE_WPK_GEMM_TILE", "64,64,32").split(","))
LN_TILE_M, LN_MAX_D, LN_EPS = 2, 1024, 1e-5
C_GM, C_GN, C_GK = (tl.constexpr(v) for v in (GEMM_TILE_M, GEMM_TILE_N, GEMM_TILE_K))
C_LM, C_LD, C_EPS = (tl.constexpr(v) for v in (LN_TILE_M, LN_MAX_D, LN_EPS))
# Triton 3.6's interpreter multiplies bf16 tiles as their raw uint16 bits and truncates fp32 to
# bf16: there, the GEMM rounds x's tile itself and multiplies in fp32 (exact: a product of two
# bf16 values fits in fp32's mantissa).
C_WIDEN = tl.constexpr(interp())


@triton.jit
def _round_bf16(v):
    """fp32 `v` rounded to the nearest bf16 (ties to even), kept in fp32: the device's
    conversion, which the interpreter's (it truncates) is not."""
    bits = v.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _gemm_k(arena, weights, x, w, rm, rn, m_rows, n_cols, k_dim, k_lo, k_hi, acc,
            ALIGNED: tl.constexpr):
    """acc + x[rm, k_lo:k_hi] @ w[rn, k_lo:k_hi]ᵀ, BLOCK_K at a time. ALIGNED: every row of x
    and w starts on a 16-byte boundary and K is a multiple of BLOCK_K (the caller checked), so
    no K mask: told so, the compiler moves x and w in 16-byte vectors, not element by element."""
    for k0 in range(k_lo, k_hi, C_GK):
        rk = k0 + tl.arange(0, C_GK)
        xo = x + rm[:, None] * k_dim + rk[None, :]
        wo = w + rn[None, :] * k_dim + rk[:, None]
        if ALIGNED:
            xo = tl.max_contiguous(tl.multiple_of(xo, [4, 4]), [1, C_GK])
            wo = tl.max_contiguous(tl.multiple_of(wo, [8, 8]), [C_GK, 1])
            a = tl.load(arena + xo, mask=rm[:, None] < m_rows, other=0.0)
            bt = tl.load(weights + wo, mask=rn[None, :] < n_cols, other=0.0)
        else:
            a = tl.load(arena + xo, mask=(rm[:, None] < m_rows) & (rk[None, :] < k_hi),
                        other=0.0)
            bt = tl.load(weights + wo, mask=(rn[None, :] < n_cols) & (rk[:, None] < k_hi),
                         other=0.0)
        if C_WIDEN:
            if bt.dtype == tl.bfloat16:
                a = _round_bf16(a)
            acc = tl.dot(a, bt.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a.to(bt.dtype), bt, acc, input_precision="ieee")
    return acc


@triton.jit(noinline=True)
def _gemm_tile(arena, weights, rec, tile):
    x, w, b, y, m_rows, n_cols, k_dim, act, scale_q, splits = X.words10(rec)
    split = tile % splits
    tile = tile // splits
    chunk = ((k_dim + splits - 1) // splits + C_GK - 1) // C_GK * C_GK
    k_lo = split * chunk
    k_hi = tl.minimum(k_lo + chunk, k_dim)
    tiles_n = (n_cols + C_GN - 1) // C_GN
    rm = (tile // tiles_n) * C_GM + tl.arange(0, C_GM)
    rn = (tile % tiles_n) * C_GN + tl.arange(0, C_GN)
    acc = tl.zeros([C_GM, C_GN], tl.float32)
    if (k_dim % C_GK == 0) & (x % 4 == 0) & (w % 8 == 0):   # so are k_lo and k_hi
        acc = _gemm_k(arena, weights, x, w, rm, rn, m_rows, n_cols, k_dim, k_lo, k_hi, acc,
                      True)
    else:
        acc = _gemm_k(arena, weights, x, w, rm, rn, m_rows, n_cols, k_dim, k_lo, k_hi, acc,
                      False)
    if b >= 0 and split == 0:
        acc += tl.load(arena + b + rn, mask=rn < n_cols, other=0.0)[None, :]
    if act == 1:
        acc = acc / (1.0 + tl.exp(-acc))
    if scale_q != C_ONE:
        acc = acc * (scale_q.to(tl.float32) / 65536.0)
    tl.store(arena + y + split * m_rows * n_cols + rm[:, None] * n_cols + rn[None, :], acc,
             mask=(rm[:, None] < m_rows) & (rn[None, :] < n_cols))


@triton.jit(noinline=True)
def _add_ln_tile(arena, rec, tile):
    x, r, gamma, beta, s_out, y, m_rows, d, alpha_q, r_splits = X.words10(rec)
    alpha = alpha_q.to(tl.float32) / 65536.0
    rm = tile * C_LM + tl.arange(0, C_LM)
    rd = tl.arange(0, C_LD)
    mask = (rm[:, None] < m_rows) & (rd[None, :] < d)
    at = rm[:, None] * d + rd[None, :]
    inner = tl.load(rec + 10)           # x strided: (row // inner)·s0 + (row % inner)·s1 + j·sd
    if inner > 0:
        x_at = (rm // inner) * tl.load(rec + 11) + (rm % inner) * tl.load(rec + 12)
        v = tl.load(arena + x + x_at[:, None] + rd[None, :] * tl.load(rec + 13), mask=mask,
                    other=0.0)
    else:
        v = tl.load(arena + x + at, mask=mask, other=0.0)
    if r >= 0:
        for j in range(0, r_splits):          # a split-K GEMM's partials, summed in order
            v += alpha * tl.load(arena + r + j * m_rows * d + at, mask=mask, other=0.0)
    if s_out >= 0:
        tl.store(arena + s_out + at, v, mask=mask)
    mean = tl.sum(v, axis=1) / d
    c = tl.where(mask, v - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(c * c, axis=1) / d + C_EPS)
    g = tl.load(arena + gamma + rd, mask=rd < d, other=0.0)
    bb = tl.load(arena + beta + rd, mask=rd < d, other=0.0)
    tl.store(arena + y + at, c * rstd[:, None] * g[None, :] + bb[None, :], mask=mask)


@triton.jit(do_not_specialize=["beat"])     # a new beat every launch: one compile
def task_program(rows, starts, counters, arena, weights, args, beat, n, TILE: tl.constexpr,
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
            _gemm_tile(arena, weights, args + tl.load(row + 4) * C_ARGS, tl.load(row + 5))
        if op == C_ADD_LN:
            _add_ln_tile(arena, args + tl.load(row + 4) * C_ARGS, tl.load(row + 5))
        if op == X.C_EW:
            X.ew_tile(arena, args + tl.load(row + 4) * C_ARGS, tl.load(row + 5))
        if op == X.C_SOFTMAX:
            X.softmax_tile(arena, args + tl.load(row + 4) * C_ARGS, tl.load(row + 5))
        if op == X.C_BGEMM:
            X.bgemm_tile(arena, args + tl.load(row + 4) * C_ARGS, tl.load(row + 5))
        if op == X.C_CONV:
            X.conv_tile(arena, args + tl.load(row + 4) * C_ARGS, tl.load(row + 5))
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
    """A task table over library ops, its argument records, and where its tensors lie: in the
    fp32 arena (`layout`, name → (offset, shape)) or in the weight arena (`wlayout`)."""
    table: TaskTable
    args: np.ndarray                    # int32 [records, ARGS]
    layout: dict
    arena: int                          # elements
    wlayout: dict
    weights: int                        # elements

    def view(self, arena: torch.Tensor, name: str) -> torch.Tensor:
        at, shape = self.layout[name]
        return arena[at:at + math.prod(shape)].view(shape)

    def wview(self, weights: torch.Tensor, name: str) -> torch.Tensor:
        at, shape = self.wlayout[name]
        return weights[at:at + math.prod(shape)].view(shape)


ALIGN = 64                  # elements: every tensor starts on a 256-byte boundary (fp32)


def align_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _place(shapes: dict) -> tuple[dict, int]:
    """Each tensor at the next ALIGN boundary (the GEMM's vectorised path needs 16 bytes)."""
    layout, at = {}, 0
    for name, shape in shapes.items():
        layout[name] = (at, shape)
        at = align_up(at + math.prod(shape))
    return layout, at


def ffn_chain(m: int, d: int, h: int, queues: int, layers: int = 1,
              bias: bool = True, split_k: int = 1) -> Block:
    """`layers` Conformer feed-forward half-steps one after another (perception runs two a
    layer) as library task ops over `m` rows (the sessions' frames). Half-step l, from its
    input x_l: u = LN₁(x_l); x_{l+1} = LN₂(x_l + ½ · (SiLU(u W₁ᵀ + b₁) W₂ᵀ + b₂)), the residual
    sum kept in `s`. Tensors are named `name.l`; x_{l+1} is `x.{l+1}`, the last one the
    chain's output. Four kernels a half-step, one counter each; every tile of a kernel waits
    for all tiles of the one before; tiles dealt round-robin to `queues` queues in kernel
    order. W₁ and W₂ lie in the weight arena, everything else in the fp32 arena. Without
    `bias` the GEMMs have none (perception's linears; b₁ and b₂ are then left unread). The
    second GEMM runs split-K in `split_k` parts: `h2.l` holds its partials [split_k, m, d],
    which the add + norm after it sums."""
    if d > LN_MAX_D:
        raise ValueError(f"add + layer norm rows of {d} > LN_MAX_D = {LN_MAX_D}")
    shapes, wshapes = {"x.0": (m, d)}, {}
    for l in range(layers):
        wshapes.update({f"w1.{l}": (h, d), f"w2.{l}": (d, h)})
        shapes.update({f"b1.{l}": (h,), f"b2.{l}": (d,), f"g1.{l}": (d,), f"be1.{l}": (d,),
                       f"g2.{l}": (d,), f"be2.{l}": (d,), f"u.{l}": (m, d), f"h1.{l}": (m, h),
                       f"h2.{l}": (split_k, m, d), f"s.{l}": (m, d), f"x.{l + 1}": (m, d)})
    layout, size = _place(shapes)
    wlayout, wsize = _place(wshapes)
    o = {name: off for name, (off, _) in layout.items()}
    w = {name: off for name, (off, _) in wlayout.items()}
    gm, gn, lm = GEMM_TILE_M, GEMM_TILE_N, LN_TILE_M
    records = []
    for l in range(layers):
        x, nxt = o[f"x.{l}"], o[f"x.{l + 1}"]
        records += [
            (ADD_LN, -(-m // lm), [x, -1, o[f"g1.{l}"], o[f"be1.{l}"], -1, o[f"u.{l}"], m, d,
                                   0, 0]),
            (GEMM, -(-m // gm) * -(-h // gn),
             [o[f"u.{l}"], w[f"w1.{l}"], o[f"b1.{l}"] if bias else -1, o[f"h1.{l}"], m, h, d, 1,
              ALPHA_ONE, 1]),
            (GEMM, -(-m // gm) * -(-d // gn) * split_k,
             [o[f"h1.{l}"], w[f"w2.{l}"], o[f"b2.{l}"] if bias else -1, o[f"h2.{l}"], m, d, h, 0,
              ALPHA_ONE, split_k]),
            (ADD_LN, -(-m // lm), [x, o[f"h2.{l}"], o[f"g2.{l}"], o[f"be2.{l}"], o[f"s.{l}"],
                                   nxt, m, d, ALPHA_ONE // 2, split_k]),
        ]
    qs: list[list[Task]] = [[] for _ in range(queues)]
    k = 0
    for i, (op, tiles, _rec) in enumerate(records):
        for t in range(tiles):
            wait, count = (i - 1, records[i - 1][1]) if i else (NONE, 0)
            qs[k % queues].append(Task(op, wait, count, i, (i, t)))
            k += 1
    args = np.array([rec + [0] * (ARGS - len(rec)) for *_, rec in records], np.int32)

    def whole(task):                  # the validator's ranges: the tensors a tile may touch
        return [(0, 0, size)]
    ops = {GEMM: OpSpec("gemm", whole), ADD_LN: OpSpec("add_layer_norm", whole)}
    return Block(TaskTable(qs, len(records), [size], ops), args, layout, size, wlayout, wsize)


def ffn_reference(block: Block, arena: torch.Tensor, weights: torch.Tensor, layer: int = 0,
                  eps: float = LN_EPS) -> dict:
    """Half-step `layer` in PyTorch (fp32 activations, fp32 sums) from the arena's x.{layer}:
    u, h1, h2, s and x.{layer + 1}. A GEMM's input is rounded to the weights' dtype first, as
    the task op's is: teacher-forced, so each half-step is judged on its own input."""
    v = lambda name: block.view(arena, f"{name}.{layer}").float()          # noqa: E731
    wv = lambda name: block.wview(weights, f"{name}.{layer}")               # noqa: E731
    mm = lambda a, wt: a.to(wt.dtype).float() @ wt.float().T                # noqa: E731
    x = v("x")
    d = x.shape[1]
    u = F.layer_norm(x, (d,), v("g1"), v("be1"), eps)
    h1 = F.silu(mm(u, wv("w1")) + v("b1"))
    h2 = mm(h1, wv("w2")) + v("b2")
    s = x + 0.5 * h2
    return {"u": u, "h1": h1, "h2": h2, "s": s,
            "x": F.layer_norm(s, (d,), v("g2"), v("be2"), eps)}
