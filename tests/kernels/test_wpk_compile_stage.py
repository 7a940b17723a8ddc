"""The stage compiler (issue 18, stage 2) on perception's IR: fusion keeps every launching op once
and in order; the emitted task tables validate; played with every program resident in random
interleavings, every tile runs only after every tile of the kernels whose results it reads (or
whose inputs or buffers it overwrites) is done, judged against dependences recomputed from the
IR, not from the compiler's own edges."""
import random

import pytest

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
                first_b, last_a = touch[b.storage][0], touch[a.storage][-1]
                if first_b != last_a:
                    needs[first_b].add(last_a)
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
