"""The memory plan of a stage's IR (issue 18, stage 2): every ACTIVATION and OUTPUT storage an
offset in one arena, so that two storages share bytes only when their lifetimes do not overlap.

A storage lives from the first node that touches it (the op that allocates it) to the last node
that touches any view of it; an OUTPUT lives to the end. Placement is greedy by size (largest
first, each at the lowest offset clear of every placed storage whose lifetime meets its own),
aligned to `ALIGN` bytes. `check` proves a plan sound independently of how it was made, and
`peak` is the lower bound any plan must reach (the most bytes live at one node).
"""
from __future__ import annotations

from dataclasses import dataclass

from gpu.wpk.ir import Graph, Storage, at

ALIGN = 256                 # bytes: a TMA/vector-friendly start for every tensor


@dataclass(frozen=True)
class Block:
    storage: int
    size: int
    first: int              # node index
    last: int


@dataclass
class Plan:
    blocks: list            # Block per planned storage
    offsets: dict           # storage id → byte offset
    arena: int              # bytes

    def overlap(self, a: Block, b: Block) -> bool:
        live = a.first <= b.last and b.first <= a.last
        oa, ob = self.offsets[a.storage], self.offsets[b.storage]
        return live and oa < ob + b.size and ob < oa + a.size


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def lifetimes(graph: Graph, batch: int | None = None,
              step_of: dict[int, int] | None = None) -> list[Block]:
    """The planned storages' sizes (at `batch` for a symbolic graph) and lifetimes, in nodes,
    or in the steps `step_of` maps nodes to (a compiled stage's kernels: what one kernel
    touches is live for all of it, since its tiles run at once; nodes it does not map, the
    views, read no data of their own)."""
    planned = {i for i, s in enumerate(graph.storages)
               if s.kind in (Storage.ACTIVATION, Storage.OUTPUT)}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k, node in enumerate(graph.nodes):
        if step_of is not None and k not in step_of:
            continue
        step = k if step_of is None else step_of[k]
        for sid in node.reads | node.writes:
            if sid in planned:
                first.setdefault(sid, step)
                last[sid] = step
    end = len(graph.nodes) if step_of is None else max(step_of.values(), default=0) + 1
    blocks = []
    for sid in sorted(first):
        info = graph.storages[sid]
        size = at(info.nbytes, batch) if batch is not None else info.nbytes
        stop = end if info.kind is Storage.OUTPUT else last[sid]
        blocks.append(Block(sid, _up(max(int(size), 1)), first[sid], stop))
    return blocks


def place(blocks: list[Block]) -> Plan:
    """Greedy by size: each block at the lowest aligned offset clear of the placed blocks it
    is live with."""
    offsets: dict[int, int] = {}
    placed: list[Block] = []
    for b in sorted(blocks, key=lambda b: (-b.size, b.first, b.storage)):
        busy = sorted((offsets[p.storage], offsets[p.storage] + p.size) for p in placed
                      if p.first <= b.last and b.first <= p.last)
        at_ = 0
        for lo, hi in busy:
            if at_ + b.size <= lo:
                break
            at_ = max(at_, hi)
        offsets[b.storage] = at_
        placed.append(b)
    arena = max((offsets[b.storage] + b.size for b in blocks), default=0)
    return Plan(list(blocks), offsets, arena)


def plan(graph: Graph, batch: int | None = None, step_of: dict[int, int] | None = None) -> Plan:
    return place(lifetimes(graph, batch, step_of))


def peak(blocks: list[Block]) -> int:
    """The most bytes live at one node: no plan's arena is smaller."""
    events = sorted({b.first for b in blocks})
    return max((sum(b.size for b in blocks if b.first <= k <= b.last) for k in events),
               default=0)


def check(p: Plan) -> list[str]:
    """Every problem of a plan: blocks live together that share bytes, misaligned or past the
    arena."""
    problems = []
    for b in p.blocks:
        o = p.offsets[b.storage]
        if o % ALIGN:
            problems.append(f"storage {b.storage} at {o}: not {ALIGN}-byte aligned")
        if o + b.size > p.arena:
            problems.append(f"storage {b.storage} ends at {o + b.size}, past the arena {p.arena}")
    for i, a in enumerate(p.blocks):
        for b in p.blocks[i + 1:]:
            if p.overlap(a, b):
                problems.append(f"storages {a.storage} and {b.storage} are live together and "
                                "share bytes")
    return problems
