"""From a stage's IR to task tables (issue 18, stage 2): fusion onto the kernel library, tiling,
dependency counters, and a static schedule of one queue a program, checked by the validator.

Passes, in order:

1. `fuse`: the IR's launching ops grouped into library kernels: a GEMM (`mm`, `addmm`, `bmm`)
   takes the pointwise ops that follow it on its output (bias, activation, residual) as its
   epilogue; `add` then `native_layer_norm` on its result is one `add_layer_norm`; other runs of
   pointwise ops, each on its predecessor's output, are one `pointwise`; row copies
   (`index_select`, `index_put_`, `index_copy_`, `gather`, `clone`, `cat`, ...) are `copy`;
   anything else is a kernel of its own. Views launch nothing and join no kernel.
2. `depend`: kernel B follows kernel A when B reads a storage A wrote (the last writer before
   B), writes one A read or wrote (in-place state, a reused buffer), or, through the memory
   plan (`memplan`, lifetimes counted in kernels: a kernel's tiles run at once), takes bytes
   of an activation A touched.
3. `tile`: each kernel's work split along its output's rows (the sessions) into tiles of
   `rows_per_tile` (GEMMs also along their output columns), so a kernel's tiles can run on
   many programs at once.
4. `schedule`: every kernel a counter that its tiles signal; a tile waits for all tiles of each
   kernel it follows (a task waits on one counter, so a tile with k producers is preceded in
   its queue by k - 1 `join` tasks, each waiting on one; a queue waits on a counter once, since
   counters only grow within a beat); tiles dealt round-robin to the programs in the IR's
   order (every queue is then in dependency order: nothing deadlocks).

Counters here are per kernel (all of a producer's tiles); the lowering can instead build
counters a block of tiles from the task ops' arena footprints (`gpu.wpk.tilecounters`). The
tables here run no numerics: their ops are the library's kernels by name;
`gpu.wpk.schedule.run` plays them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gpu.wpk import memplan
from gpu.wpk.ir import Graph, Storage, at
from gpu.wpk.schedule import NONE, OpSpec, Task, TaskTable, validate

POINTWISE = {"add", "sub", "rsub", "mul", "div", "silu", "relu", "sigmoid", "glu", "neg", "exp",
             "masked_fill", "bitwise_not", "bitwise_or", "bitwise_and", "eq", "le", "lt", "ge",
             "gt", "remainder", "where", "clamp", "_to_copy", "tanh", "pow", "sqrt", "rsqrt"}
GEMM = {"mm", "addmm", "bmm"}
COPY = {"index_select", "index_put_", "index_copy_", "gather", "clone", "cat", "stack", "copy_",
        "constant_pad_nd", "index", "arange", "fill_", "zero_"}
LIBRARY = ("join", "gemm", "add_layer_norm", "layer_norm", "pointwise", "copy", "softmax", "conv",
           "other")
OP_CODE = {name: i for i, name in enumerate(LIBRARY)}


@dataclass
class Kernel:
    name: str
    nodes: list                     # IR node indices
    reads: set = field(default_factory=set)
    writes: set = field(default_factory=set)
    after: set = field(default_factory=set)     # kernel indices it follows
    tiles: int = 1


def _outputs_of(graph: Graph, k: int) -> set:
    return {r.value for r in graph.nodes[k].outs if r is not None}


def _inputs_of(graph: Graph, k: int) -> set:
    return {r.value for r in graph.nodes[k].refs()}


def _kind(op: str) -> str:
    if op in GEMM:
        return "gemm"
    if op in POINTWISE:
        return "pointwise"
    if op in COPY:
        return "copy"
    if op == "native_layer_norm":
        return "layer_norm"
    if op in ("_softmax", "softmax"):
        return "softmax"
    if op == "convolution":
        return "conv"
    return "other"


def _storages(graph: Graph, nodes: list[int]) -> tuple[set, set]:
    reads, writes = set(), set()
    for k in nodes:
        reads |= graph.nodes[k].reads
        writes |= graph.nodes[k].writes
    return reads, writes


def reduce_edges(kernels: list[Kernel]) -> None:
    """Drops an edge A → B when B also follows a kernel that follows A: with a counter per
    kernel, every tile of that kernel waited for all of A before signalling."""
    reach: list[int] = []               # bit j: kernel j is behind kernel i
    for i, kern in enumerate(kernels):
        behind = 0
        for j in kern.after:
            behind |= reach[j]
        kern.after = {j for j in kern.after if not (behind >> j) & 1}
        for j in kern.after:
            behind |= 1 << j
        reach.append(behind)


def _task_epilogue(graph: Graph, gemm: Kernel, node) -> bool:
    """Whether the GEMM task op runs `node` as its epilogue: SiLU or a scale after a GEMM by a
    weight."""
    return graph.nodes[gemm.nodes[0]].op in ("mm", "addmm") and (
        node.op == "silu" or (node.op == "mul" and isinstance(node.args[1], float)))


def fuse(graph: Graph, pointwise_runs: bool = True) -> list[Kernel]:
    """Pass 1 (see the module's docstring); without `pointwise_runs` a pointwise op joins only
    an epilogue the GEMM task op runs (or is an add + norm's add), never another pointwise op:
    what the task ops run, one node a record, each value between them written to its planned
    place."""
    kernels: list[Kernel] = []
    last_out: set = set()            # values the open kernel produced (through views too)
    for k, node in enumerate(graph.nodes):
        if node.view:
            src = _inputs_of(graph, k)
            if kernels and src & last_out:
                last_out |= _outputs_of(graph, k)
            continue
        kind = _kind(node.op)
        ins = _inputs_of(graph, k)
        open_ = kernels[-1] if kernels else None
        joins = open_ is not None and bool(ins & last_out) and (
            (kind == "pointwise" and ((open_.name == "gemm"
                                       and (pointwise_runs or _task_epilogue(graph, open_, node)))
                                      or (open_.name == "pointwise" and pointwise_runs)))
            or (node.op == "native_layer_norm" and open_.name == "pointwise"
                and graph.nodes[open_.nodes[-1]].op == "add" and len(open_.nodes) == 1))
        split_add = (not joins and node.op == "native_layer_norm" and open_ is not None
                     and len(open_.nodes) > 1 and graph.nodes[open_.nodes[-1]].op == "add"
                     and bool(ins & _outputs_of(graph, open_.nodes[-1])))
        if joins:
            open_.nodes.append(k)
            if node.op == "native_layer_norm":
                open_.name = "add_layer_norm"
        elif split_add:             # a residual add ended a GEMM's epilogue: it goes with the norm
            add = open_.nodes.pop()
            kernels.append(Kernel("add_layer_norm", [add, k]))
            last_out = _outputs_of(graph, add)
        else:
            kernels.append(Kernel(kind, [k]))
            last_out = set()
        last_out |= _outputs_of(graph, k)
    for kern in kernels:
        kern.reads, kern.writes = _storages(graph, kern.nodes)
    return kernels


def depend(graph: Graph, kernels: list[Kernel], batch: int) -> memplan.Plan:
    """Pass 2: `Kernel.after` from data (RAW, WAR, WAW on storages) and from the memory plan's
    reuse of bytes; returns the plan."""
    last_writer: dict[int, int] = {}
    readers: dict[int, list[int]] = {}
    for i, kern in enumerate(kernels):
        for sid in kern.reads:
            if sid in last_writer and last_writer[sid] != i:
                kern.after.add(last_writer[sid])
        for sid in kern.writes:
            if sid in last_writer and last_writer[sid] != i:
                kern.after.add(last_writer[sid])
            kern.after |= {r for r in readers.get(sid, []) if r != i}
        for sid in kern.reads:
            readers.setdefault(sid, []).append(i)
        for sid in kern.writes:
            last_writer[sid] = i
            readers[sid] = []
    kernel_of = {k: i for i, kern in enumerate(kernels) for k in kern.nodes}
    plan = memplan.plan(graph, batch, kernel_of)
    touchers: dict[int, list[int]] = {}     # storage → the kernels touching it, in order
    for i, kern in enumerate(kernels):
        for sid in kern.reads | kern.writes:
            touchers.setdefault(sid, []).append(i)
    for a in plan.blocks:
        for b in plan.blocks:
            oa, ob = plan.offsets[a.storage], plan.offsets[b.storage]
            shares = oa < ob + b.size and ob < oa + a.size
            if shares and a.last < b.first and a.storage in touchers and b.storage in touchers:
                # every kernel touching the earlier storage (readers may finish in any order),
                # not only the last in the IR's order
                first_b = touchers[b.storage][0]
                kernels[first_b].after |= {i for i in touchers[a.storage] if i != first_b}
    return plan


def tile(graph: Graph, kernels: list[Kernel], batch: int, rows_per_tile: int = 16,
         cols_per_tile: int = 256) -> None:
    """Pass 3: `Kernel.tiles` from each kernel's last node's first output."""
    for kern in kernels:
        node = graph.nodes[kern.nodes[-1]]
        outs = [r for r in node.outs if r is not None]
        if not outs:
            kern.tiles = 1
            continue
        shape = at(graph.values[outs[0].value].shape, batch)
        rows = shape[0] if shape else 1
        tiles = max(1, -(-rows // rows_per_tile))
        if kern.name == "gemm" and len(shape) >= 2:
            tiles *= max(1, -(-shape[-1] // cols_per_tile))
        kern.tiles = tiles


@dataclass
class Compiled:
    kernels: list
    table: TaskTable | None         # None where the lowering schedules the kernels itself
    plan: memplan.Plan
    joins: int

    def critical_path(self) -> int:
        """The most kernels one after another (the chain no schedule can shorten)."""
        depth: dict[int, int] = {}
        for i, kern in enumerate(self.kernels):
            depth[i] = 1 + max((depth[j] for j in kern.after), default=0)
        return max(depth.values(), default=0)


def schedule(kernels: list[Kernel], programs: int) -> tuple[TaskTable, int]:
    """Pass 4: the task table (counter i is kernel i's), and how many join tasks it needed."""
    queues: list[list[Task]] = [[] for _ in range(programs)]
    waited: list[set] = [set() for _ in range(programs)]    # counters a queue already waited on
    q, joins = 0, 0
    for i, kern in enumerate(kernels):
        after = sorted(kern.after)
        for t in range(kern.tiles):
            queue = queues[q]
            # a counter only grows within a beat: one wait on it a queue is enough
            todo = [j for j in after if j not in waited[q]]
            waited[q].update(todo)
            for j in todo[:-1]:
                queue.append(Task(OP_CODE["join"], j, kernels[j].tiles, NONE, ()))
                joins += 1
            wait = todo[-1] if todo else NONE
            count = kernels[wait].tiles if todo else 0
            queue.append(Task(OP_CODE[kern.name], wait, count, i, (i, t)))
            q = (q + 1) % programs
    ops = {code: OpSpec(name) for name, code in OP_CODE.items()}
    return TaskTable(queues, len(kernels), [], ops), joins


def kernels_and_plan(graph: Graph, batch: int, pointwise_runs: bool = True
                     ) -> tuple[list[Kernel], memplan.Plan]:
    """Passes 1 and 2 (with the edges reduced): what `gpu.wpk.lower` needs, which tiles and
    schedules the kernels in its task ops' own tiles."""
    kernels = fuse(graph, pointwise_runs)
    plan = depend(graph, kernels, batch)
    reduce_edges(kernels)
    return kernels, plan


def compile_stage(graph: Graph, batch: int, programs: int = 132,
                  rows_per_tile: int = 16, pointwise_runs: bool = True) -> Compiled:
    """The passes in order, for a batch of `batch` sessions; the table must validate."""
    kernels, plan = kernels_and_plan(graph, batch, pointwise_runs)
    tile(graph, kernels, batch, rows_per_tile)
    table, joins = schedule(kernels, programs)
    problems = validate(table)
    if problems:
        raise ValueError(f"the emitted table is unsound: {problems[:3]}")
    return Compiled(kernels, table, plan, joins)


def summary(c: Compiled, graph: Graph) -> dict:
    import collections
    return {"ir_launches": graph.launches(), "kernels": len(c.kernels),
            "by_kernel": dict(collections.Counter(k.name for k in c.kernels)),
            "tasks": sum(len(q) for q in c.table.queues), "joins": c.joins,
            "critical_path_kernels": c.critical_path(),
            "arena_mb": round(c.plan.arena / 1e6, 2),
            "weights_mb": round(graph.bytes_of(Storage.WEIGHT) / 1e6, 2)}
