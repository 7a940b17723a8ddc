"""Task tables for the persistent kernel (WPK.md §5.3) and their validator (§6.1).

A table is one queue of tasks a program; a program walks its queue in order, each task waits
until its counter has had `count × beat` signals (epoch targets: counters are never reset), runs
its op on its arguments, then signals its own counter once. The device only sees the emitted
int32 rows (`TaskTable.emit`); everything that can be wrong with them is checked here first:

- ops and counters exist; a task that waits names a count of at least 1;
- every wait's count equals the signals its counter gets a beat (else the targets drift apart
  beat after beat: an early start, or a wait that never ends);
- nothing can deadlock with every program resident: the tasks, with "after its producers" and
  "after the task before it in its queue" as edges, are acyclic (a task that waits on a later
  task of its own queue is the common case, reported as such);
- every range an op touches lies inside its tensor.

`run` plays the programs against each other on the host, beat after beat, as co-resident
programs would (any program whose next wait is met may go): what the validator accepts must
finish, and each task must run after all its producers of the same beat.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

NONE = -1                   # no counter (a task that waits for nothing, or signals nothing)
ROW = 8                     # int32 words a task: op, wait, count, signal, a0..a3


@dataclass(frozen=True)
class Task:
    op: int
    wait: int = NONE        # counter index
    count: int = 0          # signals a beat its counter gets: the wait's target is count × beat
    signal: int = NONE      # counter index
    args: tuple[int, ...] = ()   # up to 4: argument-table indices and the tile index, by op


@dataclass(frozen=True)
class OpSpec:
    name: str
    # The (tensor, first element, end) ranges a task of this op touches, from its args.
    touches: Callable[[Task], list[tuple[int, int, int]]] = lambda task: []


@dataclass
class TaskTable:
    queues: list[list[Task]]
    n_counters: int
    tensor_sizes: list[int]             # elements of each tensor of the argument table
    ops: dict[int, OpSpec] = field(default_factory=dict)

    def emit(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows int32 [tasks, 8], starts int32 [queues + 1]): queue q's rows are
        rows[starts[q]:starts[q + 1]]."""
        rows = [[t.op, t.wait, t.count, t.signal, *t.args, *[0] * (4 - len(t.args))]
                for q in self.queues for t in q]
        starts = np.cumsum([0] + [len(q) for q in self.queues]).astype(np.int32)
        return np.array(rows, np.int32).reshape(-1, ROW), starts


def _tasks(table: TaskTable):
    for q, queue in enumerate(table.queues):
        for i, task in enumerate(queue):
            yield (q, i), task


def validate(table: TaskTable) -> list[str]:
    """Every problem found (empty: the table is sound)."""
    problems: list[str] = []
    signals = collections.Counter()
    producers = collections.defaultdict(list)
    for at, t in _tasks(table):
        if t.op not in table.ops:
            problems.append(f"task {at}: unknown op {t.op}")
        for kind, c in (("waits on", t.wait), ("signals", t.signal)):
            if c != NONE and not 0 <= c < table.n_counters:
                problems.append(f"task {at} {kind} counter {c} of {table.n_counters}")
        if len(t.args) > ROW - 4:
            problems.append(f"task {at}: {len(t.args)} arguments, at most {ROW - 4}")
        if t.signal != NONE:
            signals[t.signal] += 1
            producers[t.signal].append(at)
    latest = collections.defaultdict(dict)      # counter → queue → its last producer there
    for c, ats in producers.items():
        for q, i in ats:
            latest[c][q] = max(i, latest[c].get(q, -1))
    for at, t in _tasks(table):
        if t.wait == NONE:
            continue
        if t.count < 1:
            problems.append(f"task {at} waits on counter {t.wait} for {t.count} signals")
        elif t.count != signals[t.wait]:
            problems.append(f"task {at} waits for {t.count} signals of counter {t.wait}, "
                            f"which gets {signals[t.wait]} a beat")
        last = latest[t.wait].get(at[0])
        if last is not None and last >= at[1]:
            problems.append(f"task {at} waits on task {(at[0], last)}, later in its own queue")
    problems += _cycles(table, producers)
    for at, t in _tasks(table):
        spec = table.ops.get(t.op)
        for tensor, lo, hi in (spec.touches(t) if spec else []):
            if not 0 <= tensor < len(table.tensor_sizes):
                problems.append(f"task {at} ({spec.name}) touches tensor {tensor}, "
                                f"of {len(table.tensor_sizes)}")
            elif not 0 <= lo <= hi <= table.tensor_sizes[tensor]:
                problems.append(f"task {at} ({spec.name}) touches [{lo}, {hi}) of tensor "
                                f"{tensor}, which has {table.tensor_sizes[tensor]}")
    return problems


def _cycles(table: TaskTable, producers) -> list[str]:
    """Kahn's order over producer → counter → waiter and queue-order edges (a counter a node
    of its own: edges grow with tasks, not with producers × waiters): what it cannot order
    is on or behind a cycle, a deadlock even with every program resident."""
    after = collections.defaultdict(list)
    indegree = collections.Counter()
    every = [at for at, _ in _tasks(table)]
    for at, t in _tasks(table):
        if t.wait != NONE:
            after[("counter", t.wait)].append(at)
            indegree[at] += 1
        if at[1] > 0:
            after[(at[0], at[1] - 1)].append(at)
            indegree[at] += 1
    for c, ats in producers.items():
        for p in ats:
            after[p].append(("counter", c))
        indegree[("counter", c)] = len(ats)
    nodes = every + [("counter", c) for c in producers]
    ready = collections.deque(n for n in nodes if indegree[n] == 0)
    done = 0
    while ready:
        at = ready.popleft()
        done += 1
        for nxt in after[at]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    if done == len(nodes):
        return []
    stuck = sorted(at for at in every if indegree[at] > 0)
    return [f"deadlock: {len(stuck)} tasks can never run, first {stuck[:4]}"]


class Deadlock(RuntimeError):
    pass


def run(table: TaskTable, beats: int, order: Callable[[list[int]], int] = min,
        on_task: Callable[[int, tuple[int, int], Task], None] | None = None) -> list:
    """Plays `beats` beats of the table with every program resident: at each step `order`
    picks, among the programs whose next task's wait is met, the one that goes. Returns the
    tasks as they ran, (beat, (queue, index)); raises `Deadlock` when none can go."""
    counters = np.zeros(table.n_counters, np.int64)
    ran = []
    for beat in range(1, beats + 1):
        next_of = [0] * len(table.queues)
        while True:
            can = [q for q, queue in enumerate(table.queues) if next_of[q] < len(queue)
                   and (queue[next_of[q]].wait == NONE
                        or counters[queue[next_of[q]].wait] >= queue[next_of[q]].count * beat)]
            if not can:
                break
            q = order(can)
            task = table.queues[q][next_of[q]]
            if on_task:
                on_task(beat, (q, next_of[q]), task)
            ran.append((beat, (q, next_of[q])))
            if task.signal != NONE:
                counters[task.signal] += 1
            next_of[q] += 1
        left = [(q, next_of[q]) for q, queue in enumerate(table.queues) if next_of[q] < len(queue)]
        if left:
            raise Deadlock(f"beat {beat}: programs stuck at {left[:4]}")
    return ran
