"""Tile-level dependency counters (`gpu/wpk/footprint.py`, `gpu/wpk/tilecounters.py`) on
perception's whole step (tiny config), lowered as the device runs it.

Bugs these catch: a footprint that misses what a tile body really reads or writes (a GEMM's
rows, a split-K partial, an EW operand's stride or broadcast, a gather's source, a norm's
strided rows, a convolution's reach), so a block could start before what it reads is written;
a shadow of the arena that forgets a writer or a reader (a write after read, reuse of bytes by
the memory plan); a reduction that drops a dependence nothing else implies; a table whose
waits do not cover a block's dependences (a queue skipping a wait it never made); and counts
that do not match the tiles a block has (a wait that never ends, or one that ends early)."""
from __future__ import annotations

import random

import pytest
import torch

from gpu.wpk import schedule as S
from gpu.wpk import taskrun as T
from gpu.wpk import footprint
from gpu.wpk.ir import trace
from gpu.wpk.lower import lower
from gpu.wpk.stages import _traceable, perception_stage
from gpu.wpk.sync import interp
from gpu.wpk.tilecounters import TileBlocks

pytestmark = pytest.mark.skipif(not interp(), reason="the task ops run on the interpreter")


@pytest.fixture(scope="module")
def stage():
    run = perception_stage("tiny", "fp32", 2, device="cpu")
    return run, trace(**_traceable(perception_stage("tiny", "fp32", 2, device="cpu")))


def _run_tiles(low, arena, weights, tasks) -> None:
    """(op, record, tile) tasks one after another on one program, no waits or signals."""
    rows = torch.tensor([[op, -1, 0, -1, r, t, 0, 0] for op, r, t in tasks], dtype=torch.int32)
    starts = torch.tensor([0, len(tasks)], dtype=torch.int32)
    T.task_program[(1,)](rows, starts, torch.zeros(1, dtype=torch.int32), arena, weights,
                         torch.from_numpy(low.args), 1, 0, TILE=16, BLOCK_N=16, IS_INTERP=True)


def _inside(ranges, size: int) -> torch.Tensor:
    mask = torch.zeros(size, dtype=torch.bool)
    for lo, hi in ranges:
        mask[lo:hi] = True
    return mask


def _ranges(low, record: int, t0: int, t1: int):
    k = low.kernel_of(record)
    return footprint.ranges(low.ops[record], low.args[record], t0, t1,
                            lambda a: low.storage_of(k, a))


def test_footprints_hold_every_address_the_tile_bodies_touch(stage):
    """Every record of the lowered step, a random run of its tiles, run on the task ops: the
    tiles change nothing outside their write ranges, and what they write is the same when
    everything outside their read ranges is changed."""
    run, graph = stage
    low = lower(graph, 2, 3, counters=TileBlocks(4))
    rng = random.Random(5)
    tensors = run.tensors()
    for r, op in enumerate(low.ops):
        n = low.record_tiles[r]
        t0 = rng.randrange(n)
        t1 = rng.randrange(t0 + 1, n + 1)
        reads, writes = _ranges(low, r, t0, t1)
        arena, weights = low.load(tensors)
        gen = torch.Generator().manual_seed(r)
        # activations not yet written are zeros: every index read from them stays in bounds
        other = arena.clone()
        outside = ~_inside(reads, arena.numel())
        other[outside] += 1 + torch.rand(arena.shape, generator=gen)[outside]
        written = _inside(writes, arena.numel())
        # a write range is a hull: what the tiles leave of it must not differ between the runs
        arena[written & outside] = other[written & outside] = float("nan")
        before = (arena.clone(), other.clone())
        tasks = [(op, r, t) for t in range(t0, t1)]
        _run_tiles(low, arena, weights, tasks)
        _run_tiles(low, other, weights, tasks)
        for after, start in zip((arena, other), before):
            changed = (after != start) & ~(after.isnan() & start.isnan())
            assert not (changed & ~written).any(), (
                f"record {r} (op {op}) tiles {t0}..{t1} wrote outside its ranges, at "
                f"{torch.nonzero(changed & ~written).flatten()[:4].tolist()}")
        assert torch.allclose(arena[written], other[written], rtol=0, atol=0, equal_nan=True), \
            f"record {r} (op {op}) tiles {t0}..{t1} read outside its ranges"


def _conflicts(low) -> list[tuple[int, int]]:
    """Every pair of blocks (earlier, later) of different kernels where one writes what the
    other reads or writes, found pair by pair (not through the shadow)."""
    bg = low.blocks
    spans = []
    for b in range(len(bg.after)):
        k = bg.kernel_of(b)
        t0, t1 = bg.tiles_of(b)
        reads, writes, start = [], [], 0
        for r in range(low.first_record[k], len(low.ops)):
            if low.kernel_of(r) != k:
                break
            lo, hi = max(t0, start) - start, min(t1, start + low.record_tiles[r]) - start
            if lo < hi:
                rr, ww = _ranges(low, r, lo, hi)
                reads += rr
                writes += ww
            start += low.record_tiles[r]
        spans.append((k, reads, writes))

    def meet(xs, ys) -> bool:
        return any(a < d and c < b for a, b in xs for c, d in ys)
    found = []
    for j, (kj, rj, wj) in enumerate(spans):
        for i in range(j):
            ki, ri, wi = spans[i]
            if ki != kj and (meet(wi, rj + wj) or meet(ri, wj)):
                found.append((i, j))
    return found


def _behind(after: list[list[int]]) -> list[int]:
    reach = []
    for need in after:
        bits = 0
        for j in need:
            bits |= reach[j] | (1 << j)
        reach.append(bits)
    return reach


@pytest.mark.parametrize("policy", [TileBlocks(4), TileBlocks(64, "round-robin")])
def test_every_conflicting_pair_of_blocks_is_ordered(stage, policy):
    """The reduced dependences still order every pair of blocks whose ranges conflict (found
    pair by pair); dropping one dependence that nothing else implies is caught."""
    _, graph = stage
    low = lower(graph, 2, 3, counters=policy)
    conflicts = _conflicts(low)
    assert conflicts, "the step has blocks that must wait for others"

    def unordered(after) -> list:
        reach = _behind(after)
        return [(i, j) for i, j in conflicts if not (reach[j] >> i) & 1]
    assert unordered(low.blocks.after) == []
    # a planted fault: one needed dependence dropped
    after = [list(a) for a in low.blocks.after]
    j = next(j for j, a in enumerate(after) if a)
    after[j] = after[j][1:]
    assert unordered(after), "dropping a reduced dependence must leave a conflict unordered"


@pytest.mark.parametrize("policy", [TileBlocks(4), TileBlocks(3, "round-robin")])
def test_the_table_runs_each_tile_after_every_block_it_depends_on(stage, policy):
    """The emitted table, played with every program resident in random orders for two beats:
    each tile runs after all tiles of every block its own block depends on (before the
    reduction), and the validator accepts it (counts equal signals, no deadlock)."""
    _, graph = stage
    low = lower(graph, 2, 3, counters=policy)
    assert S.validate(low.table) == []
    bg = low.blocks
    for seed in range(4):
        rng = random.Random(seed)
        done = {}

        def on_task(beat, at, task):
            if task.args:               # a tile, not a join
                for d in bg.direct[task.signal]:
                    assert done.get((beat, d), 0) == bg.size(d), \
                        f"beat {beat}: block {task.signal} ran before block {d} finished"
                done[(beat, task.signal)] = done.get((beat, task.signal), 0) + 1
        S.run(low.table, 2, order=rng.choice, on_task=on_task)


def test_a_counter_a_block_of_one_is_the_compilers_counter_a_kernel(stage):
    """One block a kernel: the same waits as the compiler's counters a kernel (its edges come
    from storages and the memory plan, these from addresses), and at most as many tasks."""
    _, graph = stage
    by_kernel = lower(graph, 2, 3)
    by_block = lower(graph, 2, 3, counters=TileBlocks(1, "round-robin"))
    assert by_block.table.n_counters == by_kernel.table.n_counters
    assert sum(map(len, by_block.table.queues)) <= sum(map(len, by_kernel.table.queues))


def test_policies_refuse_what_they_cannot_do():
    with pytest.raises(ValueError, match="at least 1"):
        TileBlocks(0)
    with pytest.raises(ValueError, match="deal"):
        TileBlocks(4, "random")
