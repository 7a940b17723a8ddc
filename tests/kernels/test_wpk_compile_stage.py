"""The stage compiler (issue 18, stage 2) on perception's IR: fusion keeps every launching op once
and in order; the emitted task tables validate; played with every program resident in random
interleavings, every tile runs only after every tile of the kernels whose results it reads (or
whose inputs or arena bytes it overwrites) is done, judged against dependences recomputed from the
IR, not from the compiler's own edges."""
import random

import pytest
import torch

from gpu.wpk import compile as C
from gpu.wpk.schedule import run
from gpu.wpk.stages import perception_ir


@pytest.fixture(scope="module")
def graph():
    return perception_ir("tiny", "fp32")


def test_fusion_takes_every_launching_op_once_in_order(graph):
    kernels = C.fuse(graph)
    nodes = [k for kern in kernels for k in kern.nodes]
    launching = [k for k, n in enumerate(graph.nodes) if not n.view]
    assert nodes == launching
    names = {kern.name for kern in kernels}
    assert {"gemm", "add_layer_norm", "softmax", "conv", "copy"} <= names
    assert len(kernels) < len(launching)


def _needs(graph, kernels):
    """For each kernel, the kernels it must follow: the last writer of each storage it reads or
    writes, and the readers since then of each storage it writes (from the IR's nodes)."""
    needs = []
    last_writer, readers = {}, {}
    for i, kern in enumerate(kernels):
        reads, writes = C._storages(graph, kern.nodes)
        need = {last_writer[s] for s in reads | writes if s in last_writer} - {i}
        for s in writes:
            need |= set(readers.get(s, [])) - {i}
        for s in reads:
            readers.setdefault(s, []).append(i)
        for s in writes:
            last_writer[s], readers[s] = i, []
        needs.append(need)
    return needs


def _reuse_needs(graph, compiled, needs):
    """Bytes the memory plan gives to a later storage: the first kernel touching it must follow
    the last kernel touching the earlier one (else it overwrites what is still read)."""
    touch = {}
    for i, kern in enumerate(compiled.kernels):
        reads, writes = C._storages(graph, kern.nodes)
        for s in reads | writes:
            touch.setdefault(s, []).append(i)
    p = compiled.plan
    for a in p.blocks:
        for b in p.blocks:
            oa, ob = p.offsets[a.storage], p.offsets[b.storage]
            if a.last < b.first and oa < ob + b.size and ob < oa + a.size:
                first_b = touch[b.storage][0]
                needs[first_b] |= set(touch[a.storage]) - {first_b}
    return needs


def _violations(compiled, needs, seed):
    rng = random.Random(seed)
    done = {}                       # (beat, kernel) → tiles done
    bad = []

    def on_task(beat, at, task):
        if task.op == C.OP_CODE["join"]:
            return
        kernel, _tile = task.args
        for j in needs[kernel]:
            if done.get((beat, j), 0) < compiled.kernels[j].tiles:
                bad.append((beat, kernel, j))
        done[beat, kernel] = done.get((beat, kernel), 0) + 1
    run(compiled.table, 2, order=lambda can: rng.choice(can), on_task=on_task)
    return bad


@pytest.mark.parametrize("batch,programs", [(1, 4), (5, 16), (33, 132)])
def test_emitted_tables_validate_and_run_every_tile_after_what_it_needs(graph, batch, programs):
    c = C.compile_stage(graph, batch, programs)
    needs = _reuse_needs(graph, c, _needs(graph, c.kernels))
    for seed in range(3):
        assert _violations(c, needs, seed) == []
    assert c.critical_path() <= len(c.kernels)
    assert c.plan.arena > 0


def test_a_dropped_dependence_is_caught_by_the_play(graph):
    """The check has teeth: the same table with one kernel's wait removed lets its tiles run
    before their producer in some interleaving."""
    c = C.compile_stage(graph, 5, 16)
    needs = _needs(graph, c.kernels)
    victim = next(i for i, k in enumerate(c.kernels) if len(k.after) == 1 and k.tiles > 0
                  and i > len(c.kernels) // 2)
    for q in c.table.queues:
        for n, t in enumerate(q):
            if t.op != C.OP_CODE["join"] and t.args[0] == victim:
                q[n] = C.Task(t.op, C.NONE, 0, t.signal, t.args)
    assert any(_violations(c, needs, seed) for seed in range(20))


def _play_equals_run(graph, compiled, batch, seeds):
    from gpu.wpk.stages import perception_stage
    from gpu.wpk.tablerun import play
    direct = perception_stage("tiny", "fp32", batch, device="cpu")
    expect = direct.fn()
    for seed in seeds:
        fresh = perception_stage("tiny", "fp32", batch, device="cpu")
        try:
            got = play(graph, compiled, fresh.tensors(), batch, seed)
        except (IndexError, RuntimeError):      # a clobbered index tensor: a fault as well
            return False
        same = all(torch.equal(a, b) for a, b in zip(got, expect)) and all(
            torch.equal(fresh.tensors()[k], t) for k, t in direct.tensors().items()
            if k.startswith("state:"))
        if not same:
            return False
    return True


@pytest.mark.parametrize("batch,programs", [(3, 8), (6, 32)])
def test_the_compiled_table_played_with_activations_in_the_arena_computes_the_stage(
        graph, batch, programs):
    """Each kernel run when its last tile runs, in random interleavings, every activation in
    the planned arena: the stage's outputs and slot state equal the stage run's. A kernel run
    before its inputs are written, or two live activations sharing bytes, would change them."""
    c = C.compile_stage(graph, batch, programs)
    assert _play_equals_run(graph, c, batch, seeds=range(6))


def test_a_plan_that_overlaps_live_activations_changes_the_played_outputs(graph):
    c = C.compile_stage(graph, 3, 8)
    c.plan.offsets = {s: 0 for s in c.plan.offsets}      # every activation in the same bytes
    assert not _play_equals_run(graph, c, 3, seeds=[0])


def test_storages_one_kernel_touches_never_share_bytes(graph):
    """A kernel's tiles run at once: two storages it touches must not share bytes, even where
    one is dead before the other is born in the IR's order (a plan by nodes would let them)."""
    c = C.compile_stage(graph, 6, 32)
    p = c.plan
    for kern in c.kernels:
        reads, writes = C._storages(graph, kern.nodes)
        mine = sorted(s for s in reads | writes if s in p.offsets)
        size = {b.storage: b.size for b in p.blocks}
        for i, a in enumerate(mine):
            for b in mine[i + 1:]:
                oa, ob = p.offsets[a], p.offsets[b]
                assert not (oa < ob + size[b] and ob < oa + size[a]), (kern.name, a, b)
