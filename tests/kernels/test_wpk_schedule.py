"""Task tables and their validator (`gpu/wpk/schedule.py`), on layered tables like a model's:
every tile of a layer waits for all tiles of the layer before, tiles dealt to queues in layer
order. The validator must accept every such table, and `run` must then finish it, each task
after its producers of the same beat, whatever program goes first; each planted fault must be
named. Faults planted (one per example), each a bug it catches: a signal dropped (a wait that
never ends after the first beat), a wait count off by one (an early start, or a hang), a queue
reversed (a task waiting on a later task of its own queue: deadlock), a tile index past its
tensor (an out-of-bounds write), a counter out of range."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu.wpk.schedule import NONE, ROW, Deadlock, OpSpec, Task, TaskTable, run, validate

TILE = 4
TILE_OP = 1


def _layered(layers: list[int], queues: int) -> TaskTable:
    """Layer l's tiles write tile t of tensor l and signal counter l; layer l > 0 waits for
    all of layer l - 1's tiles."""
    qs: list[list[Task]] = [[] for _ in range(queues)]
    k = 0
    for layer, tiles in enumerate(layers):
        for tile in range(tiles):
            wait = layer - 1 if layer else NONE
            count = layers[layer - 1] if layer else 0
            qs[k % queues].append(Task(TILE_OP, wait, count, layer, (layer, tile)))
            k += 1
    ops = {TILE_OP: OpSpec("tile", lambda t: [(t.args[0], t.args[1] * TILE,
                                                (t.args[1] + 1) * TILE)])}
    return TaskTable(qs, len(layers), [tiles * TILE for tiles in layers], ops)


_LAYERS = st.lists(st.integers(1, 6), min_size=1, max_size=6)


@settings(max_examples=80, deadline=None)
@given(_LAYERS, st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_a_layered_table_is_accepted_and_runs_every_beat_in_dependency_order(layers, queues,
                                                                             seed):
    table = _layered(layers, queues)
    assert validate(table) == []
    done: dict = {}
    rng = random.Random(seed)

    def check(beat, at, task):
        if task.wait != NONE:           # every producer of this beat ran already
            assert done.get((beat, task.wait), 0) == task.count
        done[(beat, task.signal)] = done.get((beat, task.signal), 0) + 1

    ran = run(table, beats=3, order=rng.choice, on_task=check)
    assert len(ran) == 3 * sum(layers)


@settings(max_examples=80, deadline=None)
@given(_LAYERS.filter(lambda ls: len(ls) >= 2), st.integers(1, 4),
       st.sampled_from(["drop_signal", "count", "reverse", "tile", "counter"]),
       st.integers(0, 2**31 - 1))
def test_each_planted_fault_is_named(layers, queues, fault, seed):
    table = _layered(layers, queues)
    rng = random.Random(seed)
    q = rng.choice([i for i, queue in enumerate(table.queues) if queue])
    i = rng.randrange(len(table.queues[q]))
    t = table.queues[q][i]
    if fault == "drop_signal":
        last = len(layers) - 1
        candidates = [(q, i) for q, queue in enumerate(table.queues)
                      for i, t in enumerate(queue) if t.signal < last]
        q, i = rng.choice(candidates)            # a signal some later layer waits for
        table.queues[q][i] = Task(t.op, table.queues[q][i].wait, table.queues[q][i].count,
                                  NONE, table.queues[q][i].args)
        want = "a beat"
    elif fault == "count":
        waiters = [(q, i) for q, queue in enumerate(table.queues)
                   for i, t in enumerate(queue) if t.wait != NONE]
        q, i = rng.choice(waiters)
        t = table.queues[q][i]
        table.queues[q][i] = Task(t.op, t.wait, t.count + rng.choice([-1, 1]), t.signal, t.args)
        want = "signals"
    elif fault == "reverse":
        mixed = [q for q, queue in enumerate(table.queues)
                 if len({t.signal for t in queue}) > 1]
        if not mixed:
            return                               # every queue holds one layer: nothing to plant
        table.queues[mixed[0]].reverse()
        # a wait on its own queue's later task, or a cycle through another queue's
        want = ("later in its own queue", "deadlock")
    elif fault == "tile":
        table.queues[q][i] = Task(t.op, t.wait, t.count, t.signal,
                                  (t.args[0], layers[t.args[0]]))
        want = "touches"
    else:
        table.queues[q][i] = Task(t.op, t.wait, t.count, table.n_counters, t.args)
        want = "counter"
    problems = validate(table)
    wants = want if isinstance(want, tuple) else (want,)
    assert any(w in p for p in problems for w in wants), (fault, problems)


def test_a_table_the_validator_rejects_for_its_queue_order_deadlocks_when_run():
    table = _layered([2, 2], queues=1)
    table.queues[0].reverse()                    # layer 1 first, waiting on layer 0 behind it
    assert any("deadlock" in p for p in validate(table))
    with pytest.raises(Deadlock):
        run(table, beats=1)


def test_emitted_rows_hold_each_queue_in_order():
    table = _layered([3, 2], queues=2)
    rows, starts = table.emit()
    assert rows.shape == (5, ROW) and rows.dtype == np.int32
    assert starts.tolist() == [0, len(table.queues[0]), 5]
    first = table.queues[1][0]
    assert rows[starts[1]].tolist()[:6] == [first.op, first.wait, first.count, first.signal,
                                            *first.args]
