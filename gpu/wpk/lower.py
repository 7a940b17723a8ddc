"""A compiled stage lowered onto the task-table program's library ops (issue 18, stage 2): the
compiler's kernels become `gpu.wpk.taskrun` task rows and argument records, its memory plan the
program's arena, so a stage traced from the model runs as one `task_program` launch.

- Places: the weights a GEMM multiplies by sit in the weight arena (one dtype: bf16 runs the
  matmuls on tensor cores, fp32 in full precision); the fp32 arena holds first what does not
  change with the batch (the other weights, slot state, constants: `fixed` elements, the same
  places in every batch bucket's table, `gpu.wpk.buckets`), then the inputs, then the memory
  plan (ACTIVATION and OUTPUT storages at their offsets). Integers and booleans are held as
  fp32 values (`fp32_arena` sizes them so before the plan). A value is its storage's place
  plus its own storage offset, with its own shape and strides.
- Kernels: `layer_norm` → ADD_LN without a residual; `add_layer_norm` (x + α·r, then the norm)
  → ADD_LN keeping the sum (x may be strided rows); `gemm` (`mm`, or `addmm` with a bias, by a
  transposed weight) with an epilogue of SiLU then a scalar multiply → GEMM; every other
  kernel, one aten node (the compiler runs with pointwise runs unfused), → the records
  `gpu.wpk.lower_ops` gives it (`EW`, `SOFTMAX`, `BGEMM`, `CONV`). A kernel's records lie in a
  row of the argument table; its tiles run through them in order.
- Refused, with the kernel named: an op no task op runs (`lower_ops` lists them), a
  floating-point dtype other than fp32 off the weight arena, a tensor not laid out as its op
  reads it, an epsilon other than the program's, a scale that is not a multiple of 2⁻¹⁶, and
  an intermediate of a fused kernel that another kernel reads (it is never written).
- Tiles follow the op's tile shape (`GEMM_TILE_*`, `LN_TILE_M`); a GEMM whose tiles would not
  fill the programs and whose result only add + norms read runs split-K (`_split_k`); then the
  compiler's schedule deals the tiles to the programs; the table must validate.
"""
from __future__ import annotations

import bisect
import collections
import math
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from gpu.wpk import taskops as X
from gpu.wpk import taskrun as T
from gpu.wpk.compile import Compiled, kernels_and_plan, schedule
from gpu.wpk.ir import Graph, Ref, Storage, StorageInfo
from gpu.wpk.lower_ops import OpLowering, Unsupported, dense
from gpu.wpk.schedule import OpSpec, Task, TaskTable, validate
from gpu.wpk.tilecounters import BlockGraph, TileBlocks, block_graph
from gpu.wpk.tilecounters import schedule as tile_schedule

OP_NAMES = {0: "join", T.GEMM: "gemm", T.ADD_LN: "add_layer_norm", X.EW: "pointwise",
            X.SOFTMAX: "softmax", X.BGEMM: "bgemm", X.CONV: "conv"}


def fp32_arena(graph: Graph) -> Graph:
    """The graph with every storage that is not floating point sized as fp32 elements (how the
    arena holds integers and booleans): what the memory plan must place before lowering."""
    dtypes = {v.storage: v.dtype for v in graph.values}
    storages = []
    for sid, info in enumerate(graph.storages):
        dt = dtypes.get(sid)
        if dt is not None and not dt.is_floating_point and dt.itemsize != 4 \
                and not graph.fp32_arena:
            info = StorageInfo(info.kind, -(-info.nbytes // dt.itemsize) * 4, info.name)
        storages.append(info)
    return Graph(graph.nodes, graph.values, storages, graph.named, graph.outputs, graph.batch,
                 graph.held, fp32_arena=True)


@dataclass
class Lowered:
    graph: Graph
    compiled: Compiled
    table: TaskTable
    args: np.ndarray            # int32 [records, ARGS]: a kernel's records in a row
    ops: list                   # the task op of each record
    places: dict                # storage id → ("arena" | "weights", element offset)
    arena: int                  # fp32 elements
    weights: int                # elements of the weight arena
    wdtype: torch.dtype
    fixed: int                  # the arena's first elements: weights, slot state, constants
    first_record: list          # kernel → its first record (its records follow in order)
    record_tiles: list          # record → its tiles
    blocks: BlockGraph | None   # tile-level counters' blocks (None: a counter a kernel)
    storage_of: Callable        # (kernel, arena element) → its storage's range there

    def kernel_of(self, record: int) -> int:
        return bisect.bisect_right(self.first_record, record) - 1

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
            v = g.values[vid]               # at its own strides: a view is not its storage
            torch.as_strided(buf, v.shape, v.stride, at + v.offset).copy_(t.detach())
        return arena, weights

    def outputs(self, arena: torch.Tensor) -> list[torch.Tensor]:
        """The stage's outputs: views of the arena."""
        return [self._view(arena, vid) for vid in self.graph.outputs]

    def write(self, arena: torch.Tensor, name: str, t: torch.Tensor) -> None:
        """A named tensor (an input for the next beat, say) written to its place."""
        self.named(arena, name).copy_(t)

    def named(self, arena: torch.Tensor, name: str) -> torch.Tensor:
        """A named tensor's view of the arena (a state the stage updated, say); an integer or
        boolean tensor as its fp32 values."""
        return self._view(arena, self.graph.named[name])

    def _view(self, arena: torch.Tensor, vid: int) -> torch.Tensor:
        v = self.graph.values[vid]
        _, at = self.places[v.storage]
        return torch.as_strided(arena, v.shape, v.stride, at + v.offset)


def _elements(nbytes: int, dtype: torch.dtype) -> int:
    return -(-int(nbytes) // dtype.itemsize)


def _numel(info: StorageInfo, dtype: torch.dtype) -> int:
    """Elements of a storage of `fp32_arena`'s graph."""
    return _elements(info.nbytes, torch.float32 if not dtype.is_floating_point else dtype)


class _Lowering:
    def __init__(self, graph: Graph, compiled: Compiled, weight_dtype: torch.dtype | None):
        if not graph.fp32_arena:
            raise ValueError("lower `fp32_arena(graph)`: the arena holds every value as fp32")
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
        # The arena: first what does not change with the batch (weights, slot state, constants,
        # in the trace's order: the same places in every batch bucket's table), then the
        # inputs, then the memory plan; GEMM weights in the weight arena.
        self.places: dict = {}
        end, wend = 0, 0
        traced = {v.storage: v.dtype for v in graph.values}
        fixed = (Storage.WEIGHT, Storage.STATE, Storage.CONSTANT)
        touched = set().union(*(n.reads | n.writes for n in graph.nodes if not n.view))
        unplanned = [sid for sid in range(len(graph.storages))
                     if sid not in compiled.plan.offsets and sid in touched]
        for batch_independent in (True, False):
            for sid in unplanned:
                if (graph.storages[sid].kind in fixed) != batch_independent:
                    continue
                # as many elements as were traced, whatever dtype the arena holds them in
                elements = _numel(graph.storages[sid], traced[sid])
                if sid in self.gemm_weights:
                    self.places[sid] = ("weights", wend)
                    wend = T.align_up(wend + elements)
                else:
                    self.places[sid] = ("arena", end)
                    end = T.align_up(end + elements)
            if batch_independent:
                self.fixed = end
        for sid, at in compiled.plan.offsets.items():
            self.places[sid] = ("arena", end + at // 4)
        self.arena = T.align_up(end + _elements(compiled.plan.arena, torch.float32))
        self.weights = wend


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
        if len(shape) != shape_rank or not dense(v.shape, v.stride):
            raise Unsupported(f"kernel {kernel}: {what} {tuple(v.shape)} with strides "
                              f"{tuple(v.stride)} is not row-major of rank {shape_rank}")
        return at + v.offset, shape

    def value(self, ref, kernel: int, what: str) -> tuple:
        """(offset, shape, strides) of a value of any dtype the fp32 arena holds."""
        if not isinstance(ref, Ref):
            raise Unsupported(f"kernel {kernel}: {what} is not a tensor ({ref!r})")
        v = self.g.values[ref.value]
        where, at = self.places[v.storage]
        if where != "arena":
            raise Unsupported(f"kernel {kernel}: {what} lies in the weight arena")
        if v.dtype.is_floating_point and v.dtype != torch.float32:
            raise Unsupported(f"kernel {kernel}: {what} is {v.dtype}, the arena holds fp32")
        return at + v.offset, tuple(v.shape), tuple(v.stride)

    def rows(self, ref, kernel: int, what: str) -> tuple[int, int, int, tuple]:
        """(offset, rows, D, layout) of a value read as rows of its last dimension; layout
        (inner, s0, s1, sd): element j of row i at (i // inner)·s0 + (i % inner)·s1 + j·sd,
        all 0 for dense rows."""
        off, shape, stride = self.value(ref, kernel, what)
        d, m = shape[-1], math.prod(shape[:-1])
        if dense(shape, stride):
            return off, m, d, (0, 0, 0, 0)
        if len(shape) == 2:
            return off, m, d, (1, stride[0], 0, stride[1])
        if len(shape) == 3:
            return off, m, d, (shape[1], stride[0], stride[1], stride[2])
        raise Unsupported(f"kernel {kernel}: {what} {shape} with strides {stride} is not rows "
                          "of rank 2 or 3")

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


def _lower_kernel(low: _Lowering, i: int, kern) -> list[tuple[int, list[int], int]]:
    """Kernel i's records: (task op, argument record, tiles) each."""
    g = low.g
    if kern.name in ("layer_norm", "add_layer_norm") or (
            kern.name == "gemm" and g.nodes[kern.nodes[0]].op in ("mm", "addmm")):
        record, tiles = _library_kernel(low, i, kern)
        return [(T.ADD_LN if kern.name != "gemm" else T.GEMM, record, tiles)]
    if len(kern.nodes) != 1:
        raise Unsupported(f"kernel {i} ({kern.name}: {[g.nodes[k].op for k in kern.nodes]}): a "
                          "fused run has no task op (lower with pointwise runs unfused)")
    ops = OpLowering(lambda ref, what: low.value(ref, i, what),
                     lambda ref: g.values[ref.value].dtype, i)
    return ops.node(g.nodes[kern.nodes[0]])


def _library_kernel(low: _Lowering, i: int, kern) -> tuple[list[int], int]:
    """(the argument record, the tiles) of a GEMM by a weight or a norm."""
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
        x_off, m, d, x_rows = low.rows(x, i, "the norm's input")
        if list(shape) != [d] or d > T.LN_MAX_D:
            raise Unsupported(f"kernel {i}: a norm over {shape} of rows of {d} (at most "
                              f"{T.LN_MAX_D})")
        y_off, _ = low.where(ln.outs[0], i, "the norm's output", 2)
        g_off, _ = low.where(w, i, "the norm's weight", 1)
        b_off, _ = low.where(b, i, "the norm's bias", 1)
        return ([x_off, r_off, g_off, b_off, s_off, y_off, m, d, alpha_q, 1, *x_rows],
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


def _split_k(low: _Lowering, lowered: list, programs: int) -> None:
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
    records = [recs[0][1] for recs in lowered]      # a GEMM's or a norm's only record
    for i, kern in enumerate(kernels):
        rec = records[i]
        if lowered[i][0][0] != T.GEMM or rec[7] != 0:
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
        parts = min(k // (2 * T.GEMM_TILE_K), -(-programs // lowered[i][0][2]))
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
        lowered[i][0][2] *= parts
        for j in readers:
            records[j][1], records[j][9] = region[0], parts


def lower(graph: Graph, batch: int, programs: int,
          weight_dtype: torch.dtype | None = None, split_k: bool = True,
          counters: TileBlocks | None = None) -> Lowered:
    """The stage (traced at `batch`) compiled, then lowered for `programs` programs; with
    `weight_dtype` the GEMMs' weights are held (and multiplied) in that dtype whatever they
    were traced in (bf16: the bf16 profile's matmuls on tensor cores); `split_k`: GEMMs that
    can (`_split_k`) cut K when their tiles would not fill the programs; `counters`: None, a
    counter a kernel that its readers wait for whole (the compiler's edges), or tile-level
    counters (`gpu.wpk.tilecounters`): a block of a kernel's tiles waits only for the blocks
    whose arena ranges its own overlap."""
    graph = fp32_arena(graph)
    return lower_compiled(graph, _compiled(graph, batch), programs, weight_dtype, split_k,
                          counters)


def _storage_finder(low: _Lowering):
    """(kernel, address) → the arena range of the storage of that kernel holding the address:
    where an operand addressed through data (a gather's source, a scatter's target) may
    touch. The storages one kernel touches never share bytes, so at most one holds it."""
    g, kernels = low.g, low.c.kernels
    dtypes = {v.storage: v.dtype for v in g.values}

    def find(k: int, address: int) -> tuple[int, int]:
        for sid in kernels[k].reads | kernels[k].writes:
            where, at = low.places.get(sid, ("", -1))
            if where != "arena":
                continue
            end = at + _numel(g.storages[sid], dtypes[sid])
            if at <= address < end:
                return at, end
        raise ValueError(f"kernel {k}: no storage it touches holds arena element {address}")
    return find


def _compiled(graph: Graph, batch: int) -> Compiled:
    """The compiler's kernels and memory plan for lowering: pointwise runs unfused, no table
    of the compiler's own (the lowering tiles and schedules in its ops' tiles)."""
    kernels, plan = kernels_and_plan(graph, batch, pointwise_runs=False)
    return Compiled(kernels, None, plan, 0)


def lower_compiled(graph: Graph, compiled: Compiled, programs: int,
                   weight_dtype: torch.dtype | None = None, split_k: bool = True,
                   counters: TileBlocks | None = None) -> Lowered:
    """`lower` of a stage the compiler already ran on (for `programs` programs; the graph
    `fp32_arena`'s, compiled with pointwise runs unfused where it has any)."""
    _check_intermediates(graph, compiled)
    low = _Lowering(graph, compiled, weight_dtype)
    lowered = [[list(r) for r in _lower_kernel(low, i, kern)]
               for i, kern in enumerate(compiled.kernels)]
    if split_k:
        _split_k(low, lowered, programs)
    first, flat = [], []                     # kernel → its first record; (op, record, tiles)
    for i, (kern, recs) in enumerate(zip(compiled.kernels, lowered)):
        first.append(len(flat))
        flat += recs
        kern.tiles = sum(tiles for *_, tiles in recs)
    storage_of, blocks = _storage_finder(low), None
    if counters is None:
        table, _ = schedule(compiled.kernels, programs)
    else:
        blocks = block_graph(lowered, counters, storage_of)
        table, _ = tile_schedule(blocks, programs, counters.deal)

    def task(t: Task) -> Task:
        if not t.args:                      # a join
            return t
        r, tile = first[t.args[0]], t.args[1]
        while tile >= flat[r][2]:           # a kernel's tiles run through its records in order
            tile -= flat[r][2]
            r += 1
        return Task(flat[r][0], t.wait, t.count, t.signal, (r, tile))
    whole = [(0, 0, max(low.arena, 1))]
    ops = {code: OpSpec(name, lambda task: whole) for code, name in OP_NAMES.items()}
    table = TaskTable([[task(t) for t in q] for q in table.queues], table.n_counters,
                      [max(low.arena, 1)], ops)
    problems = validate(table)
    if problems:
        raise ValueError(f"the lowered table is unsound: {problems[:3]}")
    args = np.array([rec + [0] * (T.ARGS - len(rec)) for _, rec, _ in flat], np.int32)
    return Lowered(graph, compiled, table, args.reshape(-1, T.ARGS), [op for op, *_ in flat],
                   low.places, low.arena, low.weights, low.wdtype, low.fixed, first,
                   [tiles for *_, tiles in flat], blocks, storage_of)


def coverage(graph: Graph, batch: int) -> dict:
    """How much of a stage the task ops can run today: per kernel kind, the kernels lowered
    and the refused, with the commonest reasons (numbers stripped)."""
    graph = fp32_arena(graph)
    compiled = _compiled(graph, batch)
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
