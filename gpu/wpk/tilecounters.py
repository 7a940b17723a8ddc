"""Tile-level dependency counters (issue 18, stage 2): a kernel's tiles signal one counter a
block of them, and a tile waits only for the blocks of earlier kernels whose arena ranges its
own block's overlap, not for every tile of every kernel before it.

- Blocks: a kernel's tiles cut into at most `TileBlocks.per_kernel` runs of consecutive tiles
  (a run of a GEMM's or a norm's tiles is a run of its rows), each a counter.
- Dependences from addresses: the kernels are taken in the IR's order (an order that computes
  the stage); a shadow of the arena keeps, for every range, the blocks that last wrote it and
  those that read it since. A block reads after the writers of what it reads, and writes after
  the writers and readers of what it writes (`gpu.wpk.footprint` gives each block's ranges, as
  hulls). Arena reuse by the memory plan needs no edges of its own: reused bytes are the same
  addresses. Blocks of one kernel never wait on each other (its tiles run at once, as the
  memory plan assumes).
- Reduced: a dependence already implied by another one's (transitive closure over blocks,
  bitsets) is dropped.
- Dealt to the programs by rows (`schedule`: a program takes the same share of every kernel)
  or round-robin as the compiler deals; a queue skips waits its earlier waits imply; a tile
  with k blocks still to wait for has k - 1 `join` tasks before it.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable

from gpu.wpk import footprint
from gpu.wpk.compile import OP_CODE
from gpu.wpk.schedule import NONE, OpSpec, Task, TaskTable


@dataclass(frozen=True)
class TileBlocks:
    """The counter policy: at most `per_kernel` counters a kernel, each over a run of its
    consecutive tiles; `deal`: how tiles go to the programs (`schedule`)."""
    per_kernel: int = 8
    deal: str = "rows"

    def __post_init__(self):
        if self.per_kernel < 1:
            raise ValueError(f"per_kernel must be at least 1, not {self.per_kernel}")
        if self.deal not in ("rows", "round-robin"):
            raise ValueError(f"deal is 'rows' or 'round-robin', not {self.deal!r}")

    def cuts(self, tiles: int) -> list[int]:
        """The first tile of each block, and the end."""
        blocks = min(tiles, self.per_kernel)
        return [tiles * b // blocks for b in range(blocks + 1)]


class Shadow:
    """The arena as disjoint segments [start_i, start_{i+1}), each with the blocks that last
    wrote it (all of one kernel) and the blocks that read it since."""

    def __init__(self, kernel_of: list[int]):
        self.kernel_of = kernel_of
        self.starts: list[int] = [0]
        self.writers: list[tuple] = [()]
        self.readers: list[frozenset] = [frozenset()]

    def _cut(self, x: int) -> int:
        i = bisect.bisect_right(self.starts, x) - 1
        if self.starts[i] != x:
            self.starts.insert(i + 1, x)
            self.writers.insert(i + 1, self.writers[i])
            self.readers.insert(i + 1, self.readers[i])
            i += 1
        return i

    def _span(self, lo: int, hi: int) -> range:
        i = self._cut(lo)
        return range(i, self._cut(hi))

    def hazards(self, lo: int, hi: int, write: bool) -> set:
        found: set = set()
        for i in self._span(lo, hi):
            found.update(self.writers[i])
            if write:
                found.update(self.readers[i])
        return found

    def read(self, lo: int, hi: int, block: int) -> None:
        for i in self._span(lo, hi):
            self.readers[i] = self.readers[i] | {block}

    def write(self, lo: int, hi: int, block: int) -> None:
        kernel = self.kernel_of[block]
        span = self._span(lo, hi)
        for i in span:
            mine = bool(self.writers[i]) and self.kernel_of[self.writers[i][0]] == kernel
            self.writers[i] = (*self.writers[i], block) if mine else (block,)
            # readers of earlier kernels are behind this write now (it waited for them)
            self.readers[i] = frozenset(r for r in self.readers[i] if self.kernel_of[r] == kernel)
        # neighbours left identical by the write merge back (keeps the shadow small)
        for i in reversed(range(max(span.start, 1), min(span.stop + 1, len(self.starts)))):
            if self.writers[i] == self.writers[i - 1] and self.readers[i] == self.readers[i - 1]:
                del self.starts[i], self.writers[i], self.readers[i]


@dataclass
class BlockGraph:
    cuts: list[list[int]]           # kernel → its blocks' first tiles and end
    first: list[int]                # kernel → its first block's counter
    after: list[list[int]]          # block → the blocks it waits for (reduced)
    direct: list[set]               # block → every block it must follow (before reduction)

    def block_of(self, kernel: int, tile: int) -> int:
        return self.first[kernel] + bisect.bisect_right(self.cuts[kernel], tile) - 1

    def kernel_of(self, block: int) -> int:
        return bisect.bisect_right(self.first, block) - 1

    def tiles_of(self, block: int) -> tuple[int, int]:
        """The block's first tile of its kernel, and its end."""
        k = self.kernel_of(block)
        b = block - self.first[k]
        return self.cuts[k][b], self.cuts[k][b + 1]

    def size(self, block: int) -> int:
        t0, t1 = self.tiles_of(block)
        return t1 - t0


def block_graph(kernel_records: list[list[tuple]], policy: TileBlocks,
                storage_of: Callable[[int, int], tuple[int, int]]) -> BlockGraph:
    """Blocks and their dependences. `kernel_records[k]`: kernel k's records in order, each
    (op, record words, tiles); `storage_of(k, address)`: the range of the storage of kernel k
    holding `address` (for operands addressed through data)."""
    cuts, first, kernel_of = [], [], []
    for k, recs in enumerate(kernel_records):
        c = policy.cuts(sum(t for *_, t in recs))
        cuts.append(c)
        first.append(len(kernel_of))
        kernel_of += [k] * (len(c) - 1)
    shadow = Shadow(kernel_of)
    direct: list[set] = []
    for k, recs in enumerate(kernel_records):
        touched = []
        for b in range(len(cuts[k]) - 1):
            reads, writes = _block_ranges(recs, cuts[k][b], cuts[k][b + 1],
                                          lambda a, k=k: storage_of(k, a))
            need: set = set()
            for lo, hi in reads:
                need |= shadow.hazards(lo, hi, write=False)
            for lo, hi in writes:
                need |= shadow.hazards(lo, hi, write=True)
            direct.append(need)
            touched.append((first[k] + b, reads, writes))
        for block, _, writes in touched:        # against the state before this kernel
            for lo, hi in writes:
                shadow.write(lo, hi, block)
        for block, reads, _ in touched:
            for lo, hi in reads:
                shadow.read(lo, hi, block)
    return BlockGraph(cuts, first, _reduce(direct), direct)


def _block_ranges(recs: list[tuple], t0: int, t1: int, storage_of) -> tuple[list, list]:
    """A block's ranges: tiles t0..t1-1 of a kernel run through its records in order."""
    reads, writes, start = [], [], 0
    for op, rec, tiles in recs:
        lo, hi = max(t0, start) - start, min(t1, start + tiles) - start
        if lo < hi:
            r, w = footprint.ranges(op, rec, lo, hi, storage_of)
            reads += r
            writes += w
        start += tiles
    return reads, writes


def _reduce(direct: list[set]) -> list[list[int]]:
    """Each block's dependences less those another of them already implies."""
    reach: list[int] = []           # bit j: block j is behind block i
    after = []
    for need in direct:
        behind = 0
        for j in need:
            behind |= reach[j]
        keep = sorted(j for j in need if not (behind >> j) & 1)
        for j in keep:
            behind |= 1 << j
        reach.append(behind)
        after.append(keep)
    return after


def schedule(graph: BlockGraph, programs: int, deal: str = "rows") -> tuple[TaskTable, int]:
    """The task table (counter i is block i's) and its join tasks, a tile's task with arguments
    (kernel, tile) for the caller to map onto its record (`gpu.wpk.lower`). A queue skips a
    wait that a wait it already made implies (its block is behind the one waited for).

    `deal`: "round-robin" deals each kernel's tiles to the programs in turn, in the IR's order;
    "rows" gives tile t of a kernel of n the programs' share t·P/n (a rotating pick inside it
    when n < P), so a program takes the same part of every kernel: the part whose producers
    it ran itself or its neighbours did, and its waits are few and met early."""
    reach: list[int] = []           # block → the blocks behind it, as a bitset
    for need in graph.after:
        behind = 0
        for j in need:
            behind |= reach[j] | (1 << j)
        reach.append(behind)
    queues: list[list[Task]] = [[] for _ in range(programs)]
    covered = [0] * programs        # blocks a queue's waits so far imply
    rr, turn, joins = 0, 0, 0
    for k, c in enumerate(graph.cuts):
        n = c[-1]
        for t in range(n):
            if deal == "round-robin":
                q, rr = rr, (rr + 1) % programs
            else:
                share = max(1, programs // n)
                q = (t * programs // n + turn % share) % programs
            block = graph.block_of(k, t)
            queue = queues[q]
            todo = [j for j in graph.after[block] if not (covered[q] >> j) & 1]
            for j in todo:
                covered[q] |= reach[j] | (1 << j)
            for j in todo[:-1]:
                queue.append(Task(OP_CODE["join"], j, graph.size(j), NONE, ()))
                joins += 1
            wait = todo[-1] if todo else NONE
            count = graph.size(wait) if todo else 0
            queue.append(Task(OP_CODE["other"], wait, count, block, (k, t)))
        turn += 1
    return TaskTable(queues, len(graph.after), [], {c: OpSpec(n) for n, c in OP_CODE.items()}), \
        joins
