"""A compiled stage lowered onto the task-table program's library ops (issue 18, stage 2): the
compiler's kernels become `gpu.wpk.taskrun` task rows and argument records, its memory plan the
program's arena, so a stage traced from the model runs as one `task_program` launch.

- Places: an ACTIVATION or OUTPUT storage sits at its memory-plan offset in the fp32 arena; the
  weights a GEMM multiplies by sit in the weight arena (one dtype: bf16 runs the matmuls on
  tensor cores, fp32 in full precision); every other storage the stage reads (inputs, norms'
  weights and biases, constants) follows the plan in the fp32 arena. A value is its storage's
  place plus its own storage offset, with its own shape and strides.
- Kernels: `layer_norm` → ADD_LN without a residual; `add_layer_norm` (x + α·r, then the norm)
  → ADD_LN keeping the sum; `gemm` (`mm`, or `addmm` with a bias, by a transposed weight) with an
  epilogue of SiLU then a scalar multiply → GEMM. The record of kernel i is argument record i.
- Refused, with the kernel named: any other kernel (convolutions, softmax, copies and pointwise
  runs have no task op yet), a dtype other than fp32 off the weight arena, a tensor not laid
  out as its op reads it, an epsilon other than the program's, a scale that is not a multiple
  of 2⁻¹⁶, and an intermediate of a fused kernel that another kernel reads (it is never
  written).
- Tiles follow the op's tile shape (`GEMM_TILE_*`, `LN_TILE_M`); a GEMM whose tiles would not
  fill the programs and whose result only add + norms read runs split-K (`_split_k`); then the
  compiler's schedule deals the tiles to the programs; the table must validate.
"""
from __future__ import annotations

import collections
import math
import re
from dataclasses import dataclass

import numpy as np
import torch

from gpu.wpk import taskrun as T
from gpu.wpk.compile import LIBRARY, Compiled, compile_stage, schedule
from gpu.wpk.ir import Graph, Ref
from gpu.wpk.schedule import OpSpec, Task, TaskTable, validate

TASK_OP = {"join": 0, "gemm": T.GEMM, "layer_norm": T.ADD_LN, "add_layer_norm": T.ADD_LN}


class Unsupported(ValueError):
    """A kernel the task ops cannot run as it is."""


@dataclass
class Lowered:
    graph: Graph
    compiled: Compiled
    table: TaskTable
    args: np.ndarray            # int32 [kernels, ARGS]
    places: dict                # storage id → ("arena" | "weights", element offset)
    arena: int                  # fp32 elements
    weights: int                # elements of the weight arena
    wdtype: torch.dtype

    def load(self, tensors: dict[str, torch.Tensor], device: str = "cpu"
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """(arena, weights) holding the named tensors (and the constants traced) at their
        places; activations start at zero."""
        arena = torch.zeros(max(self.arena, 1), device=device)
        weights = torch.zeros(max(self.weights, 1), dtype=self.wdtype, device=device)
        g = self.graph
        bound = {g.named[k]: t for k, t in tensors.items()} | dict(g.held)
        for vid, t in bound.items():
            sid = g.values[vid].storage
            if sid not in self.places:
                continue                    # the stage never reads it
            where, at = self.places[sid]
            buf = arena if where == "arena" else weights
            flat = t.detach().reshape(-1)
            start = at + g.values[vid].offset
            buf[start:start + flat.numel()] = flat.to(buf.dtype)
        return arena, weights

    def outputs(self, arena: torch.Tensor) -> list[torch.Tensor]:
        """The stage's outputs: views of the arena."""
        return [self._view(arena, vid) for vid in self.graph.outputs]

    def _view(self, arena: torch.Tensor, vid: int) -> torch.Tensor:
        v = self.graph.values[vid]
        _, at = self.places[v.storage]
        return torch.as_strided(arena, v.shape, v.stride, at + v.offset)


def _elements(nbytes: int, dtype: torch.dtype) -> int:
    return -(-int(nbytes) // dtype.itemsize)


class _Lowering:
    def __init__(self, graph: Graph, compiled: Compiled, weight_dtype: torch.dtype | None):
        self.g, self.c = graph, compiled
        self.gemm_weights: set = set()
        for kern in compiled.kernels:
            if kern.name == "gemm":
                node = graph.nodes[kern.nodes[0]]
                if node.op in ("mm", "addmm"):
                    self.gemm_weights.add(graph.values[node.args[-1].value].storage)
        dtypes = {graph.values[vid].dtype for vid in range(len(graph.values))
                  if graph.values[vid].storage in self.gemm_weights}
        if len(dtypes) > 1 and weight_dtype is None:
            raise Unsupported(f"the GEMMs' weights mix dtypes {sorted(map(str, dtypes))}: the "
                              "weight arena has one")
        self.wdtype = weight_dtype or (dtypes.pop() if dtypes else torch.float32)
        self.places: dict = {}
        for sid, at in compiled.plan.offsets.items():
            self.places[sid] = ("arena", at // 4)
        end, wend = _elements(compiled.plan.arena, torch.float32), 0
        traced = {v.storage: v.dtype for v in graph.values}
        for sid, info in enumerate(graph.storages):
            if sid in self.places or not self._read(sid):
                continue
            if sid in self.gemm_weights:
                # as many elements as were traced, whatever dtype the arena holds them in
                self.places[sid] = ("weights", wend)
                wend = T.align_up(wend + _elements(info.nbytes, traced[sid]))
            else:
                self.places[sid] = ("arena", end)
                end = T.align_up(end + _elements(info.nbytes, torch.float32))
        self.arena, self.weights = end, wend

    def _read(self, sid: int) -> bool:
        return any(sid in n.reads | n.writes for n in self.g.nodes if not n.view)

    def where(self, ref, kernel: int, what: str, shape_rank: int) -> tuple[int, tuple]:
        """(element offset, shape) of a row-major value the op reads or writes in its arena;
        for rank 2, a dense value of higher rank counts as its rows ([B, F, D] → [B·F, D])."""
        if not isinstance(ref, Ref):
            raise Unsupported(f"kernel {kernel}: {what} is not a tensor ({ref!r})")
        v = self.g.values[ref.value]
        arena, at = self.places[v.storage]
        dtype = self.wdtype if arena == "weights" else torch.float32
        if v.dtype != dtype:
            raise Unsupported(f"kernel {kernel}: {what} is {v.dtype}, its arena holds {dtype}")
        shape = tuple(v.shape)
        if shape_rank == 2 and len(shape) > 2:
            shape = (math.prod(shape[:-1]), shape[-1])
        dense = tuple(v.stride) == tuple(math.prod(v.shape[i + 1:]) for i in range(len(v.shape)))
        if len(shape) != shape_rank or not dense:
            raise Unsupported(f"kernel {kernel}: {what} {tuple(v.shape)} with strides "
                              f"{tuple(v.stride)} is not row-major of rank {shape_rank}")
        return at + v.offset, shape

    def weight(self, ref, kernel: int) -> tuple[int, int, int]:
        """A GEMM's B operand: a transposed view [K, N] of a weight W [N, K] → (offset, N, K)."""
        v = self.g.values[ref.value]
        where, at = self.places[v.storage]
        if where != "weights" or len(v.shape) != 2 or tuple(v.stride) != (1, v.shape[0]):
            raise Unsupported(f"kernel {kernel}: the GEMM's B operand is not a transposed "
                              f"weight (shape {tuple(v.shape)}, strides {tuple(v.stride)})")
        return at + v.offset, v.shape[1], v.shape[0]


def _quantised(x: float, kernel: int, what: str) -> int:
    q = round(x * T.ALPHA_ONE)
    if q / T.ALPHA_ONE != x:
        raise Unsupported(f"kernel {kernel}: {what} {x} is not a multiple of 2^-16")
    return q


def _layer_norm_args(node, i: int) -> tuple:
    x, shape, w, b, eps = (list(node.args) + [None] * 5)[:5]
    if b is None or w is None:
        raise Unsupported(f"kernel {i}: a layer norm without weight and bias")
    if abs(float(eps) - T.LN_EPS) > 1e-12:
        raise Unsupported(f"kernel {i}: epsilon {eps}, the task op's is {T.LN_EPS}")
    return x, w, b, shape


def _lower_kernel(low: _Lowering, i: int, kern) -> tuple[list[int], int]:
    """(the argument record, the tiles) of kernel i."""
    g = low.g
    nodes = [g.nodes[k] for k in kern.nodes]
    if kern.name in ("layer_norm", "add_layer_norm"):
        ln = nodes[-1]
        x, w, b, shape = _layer_norm_args(ln, i)
        r_off, s_off, alpha_q = -1, -1, T.ALPHA_ONE
        if kern.name == "add_layer_norm":
            add = nodes[0]
            if add.op != "add" or len(add.args) != 2:
                raise Unsupported(f"kernel {i}: {add.op} before the norm is not a plain add")
            alpha_q = _quantised(float(add.kwargs.get("alpha", 1)), i, "the add's alpha")
            x, r = add.args
            r_off, _ = low.where(r, i, "the residual", 2)
            s_off, _ = low.where(add.outs[0], i, "the sum", 2)
        x_off, (m, d) = low.where(x, i, "the norm's input", 2)
        if list(shape) != [d] or d > T.LN_MAX_D:
            raise Unsupported(f"kernel {i}: a norm over {shape} of rows of {d} (at most "
                              f"{T.LN_MAX_D})")
        y_off, _ = low.where(ln.outs[0], i, "the norm's output", 2)
        g_off, _ = low.where(w, i, "the norm's weight", 1)
        b_off, _ = low.where(b, i, "the norm's bias", 1)
        return ([x_off, r_off, g_off, b_off, s_off, y_off, m, d, alpha_q, 1],
                -(-m // T.LN_TILE_M))
    if kern.name == "gemm":
        mm, epilogue = nodes[0], nodes[1:]
        if mm.op == "mm":
            bias, a, wt = None, *mm.args
        elif mm.op == "addmm" and not mm.kwargs:
            bias, a, wt = mm.args
        else:
            raise Unsupported(f"kernel {i}: {mm.op} is not a GEMM the task op runs")
        a_off, (m, k) = low.where(a, i, "the GEMM's input", 2)
        w_off, n, k_w = low.weight(wt, i)
        if k_w != k:
            raise Unsupported(f"kernel {i}: inner sizes {k} and {k_w} differ")
        b_off = -1 if bias is None else low.where(bias, i, "the bias", 1)[0]
        act, scale_q = 0, T.ALPHA_ONE
        for node in epilogue:
            if node.op == "silu" and act == 0 and scale_q == T.ALPHA_ONE:
                act = 1
            elif node.op == "mul" and isinstance(node.args[1], float) and scale_q == T.ALPHA_ONE:
                scale_q = _quantised(node.args[1], i, "the scale")
            else:
                raise Unsupported(f"kernel {i}: the GEMM's epilogue {[n.op for n in epilogue]} "
                                  "is not [silu][, mul by a number]")
        y_off, _ = low.where(nodes[-1].outs[0], i, "the GEMM's output", 2)
        tiles = -(-m // T.GEMM_TILE_M) * -(-n // T.GEMM_TILE_N)
        return [a_off, w_off, b_off, y_off, m, n, k, act, scale_q, 1], tiles
    raise Unsupported(f"kernel {i} ({kern.name}: {[n.op for n in nodes]}) has no task op yet")


def _check_intermediates(graph: Graph, compiled: Compiled) -> None:
    """A fused kernel writes only its last node's result (and an add + norm's sum): nothing
    outside it may read another of its values."""
    written = {}
    for i, kern in enumerate(compiled.kernels):
        last = graph.nodes[kern.nodes[-1]]
        keep = {last.outs[0].value} if last.outs and last.outs[0] is not None else set()
        if kern.name == "add_layer_norm":
            keep.add(graph.nodes[kern.nodes[0]].outs[0].value)
        for k in kern.nodes:
            for ref in graph.nodes[k].outs:
                if ref is not None and ref.value not in keep:
                    written[graph.values[ref.value].storage] = (i, set(kern.nodes))
    for k, node in enumerate(graph.nodes):
        if node.view:           # reads no data; what reads through it shares its storage
            continue
        for ref in node.refs():
            hit = written.get(graph.values[ref.value].storage)
            if hit is not None and k not in hit[1]:
                raise Unsupported(f"node {k} ({node.op}) reads a value kernel {hit[0]} never "
                                  "writes")
    outs = {graph.values[v].storage for v in graph.outputs}
    for sid, (i, _) in written.items():
        if sid in outs:
            raise Unsupported(f"an output is a value kernel {i} never writes")


def _split_k(low: _Lowering, records: list, programs: int) -> None:
    """A GEMM without activation whose result only add + norms read, as their residual, runs
    split-K when its tiles would not fill the programs: S parts (each at least two K tiles)
    write partials to a region after the arena, which its readers sum. Regions are shared by
    GEMMs that follow every kernel of the region's earlier users (nothing still reads it)."""
    g, kernels = low.g, low.c.kernels
    behind: list[set] = []
    for kern in kernels:
        behind.append(set().union(*(behind[j] | {j} for j in kern.after)) if kern.after else set())
    outs = {g.values[v].storage for v in g.outputs}
    regions: list[list] = []                  # [offset, elements, users]
    for i, kern in enumerate(kernels):
        rec = records[i]
        if kern.name != "gemm" or rec[7] != 0:
            continue
        sid = g.values[g.nodes[kern.nodes[-1]].outs[0].value].storage
        readers = [j for j, other in enumerate(kernels) if j != i and sid in other.reads]

        def residual(j: int) -> bool:           # reads the result as its add's second term only
            if kernels[j].name != "add_layer_norm":
                return False
            x, r = (g.values[a.value].storage for a in g.nodes[kernels[j].nodes[0]].args[:2])
            return r == sid and x != sid
        if sid in outs or not readers or not all(residual(j) for j in readers):
            continue
        m, n, k = rec[4], rec[5], rec[6]
        parts = min(k // (2 * T.GEMM_TILE_K), -(-programs // kern.tiles))
        if parts < 2:
            continue
        size = parts * m * n
        region = next((r for r in regions if r[1] >= size and r[2] <= behind[i]), None)
        if region is None:
            region = [low.arena, size, set()]
            low.arena = T.align_up(low.arena + size)
            regions.append(region)
        region[2] |= {i, *readers}
        rec[3], rec[9] = region[0], parts
        kern.tiles *= parts
        for j in readers:
            records[j][1], records[j][9] = region[0], parts


def lower(graph: Graph, batch: int, programs: int,
          weight_dtype: torch.dtype | None = None, split_k: bool = True) -> Lowered:
    """The stage (traced at `batch`) compiled, then lowered for `programs` programs; with
    `weight_dtype` the GEMMs' weights are held (and multiplied) in that dtype whatever they
    were traced in (bf16: the bf16 profile's matmuls on tensor cores); `split_k`: GEMMs that
    can (`_split_k`) cut K when their tiles would not fill the programs."""
    return lower_compiled(graph, compile_stage(graph, batch, programs), programs, weight_dtype,
                          split_k)


def lower_compiled(graph: Graph, compiled: Compiled, programs: int,
                   weight_dtype: torch.dtype | None = None, split_k: bool = True) -> Lowered:
    """`lower` of a stage the compiler already ran on (for `programs` programs)."""
    _check_intermediates(graph, compiled)
    low = _Lowering(graph, compiled, weight_dtype)
    records = []
    for i, kern in enumerate(compiled.kernels):
        record, kern.tiles = _lower_kernel(low, i, kern)
        records.append(record)
    if split_k:
        _split_k(low, records, programs)
    table, _ = schedule(compiled.kernels, programs)
    whole = [(0, 0, max(low.arena, 1))]
    ops = {code: OpSpec(name, lambda task: whole) for name, code in TASK_OP.items()}
    queues = [[Task(TASK_OP[LIBRARY[t.op]], t.wait, t.count, t.signal, t.args)
               for t in q] for q in table.queues]
    table = TaskTable(queues, table.n_counters, [max(low.arena, 1)], ops)
    problems = validate(table)
    if problems:
        raise ValueError(f"the lowered table is unsound: {problems[:3]}")
    return Lowered(graph, compiled, table, np.array(records, np.int32).reshape(-1, T.ARGS),
                   low.places, low.arena, low.weights, low.wdtype)


def coverage(graph: Graph, batch: int, programs: int = 132) -> dict:
    """How much of a stage the task ops can run today: per kernel kind, the kernels lowered
    and the refused, with the commonest reasons (numbers stripped)."""
    compiled = compile_stage(graph, batch, programs)
    low = _Lowering(graph, compiled, torch.bfloat16)
    kinds: dict = collections.defaultdict(lambda: {"lowered": 0, "refused": 0})
    reasons: collections.Counter = collections.Counter()
    for i, kern in enumerate(compiled.kernels):
        try:
            _lower_kernel(low, i, kern)
            kinds[kern.name]["lowered"] += 1
        except Unsupported as e:
            kinds[kern.name]["refused"] += 1
            reasons[re.sub(r"\d+", "N", str(e).split(": ", 1)[-1])[:90]] += 1
    return {"kernels": len(compiled.kernels),
            "lowered": sum(k["lowered"] for k in kinds.values()),
            "by_kind": dict(kinds), "top_reasons": dict(reasons.most_common(6))}
