"""The persistent kernel's synchronisation primitives (`gpu/wpk/sync.py`) in the threaded
interpreter (`tests/kernels/wpk_threads.py`).

Bugs these catch: a wait that returns before its counter reaches the target (a chain that adds
an unfinished value); a signal that counts once per thread instead of once per program, or a
grid barrier whose epoch target is off by one (a round that reads another round's writes, or a
barrier that lets programs through early); a doorbell wait that misses or repeats a beat; a
threaded runner that runs programs one after another (the chain would never finish) or that
hangs instead of reporting a deadlock."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from bench.harness import wpk_probes as probes
from gpu.wpk.sync import interp
from tests.kernels.wpk_threads import Deadlock, threaded

pytestmark = pytest.mark.skipif(not interp(), reason="the interpreter's threaded runs")


def test_a_chain_against_launch_order_finishes_only_with_programs_together():
    n = 6
    values = torch.arange(1, n + 1, dtype=torch.int32)
    counters = torch.zeros(n, dtype=torch.int32)
    out = torch.zeros(n, dtype=torch.int32)
    threaded(probes.chain, (n,), values, counters, out, n, IS_INTERP=True, timeout_s=60)
    # out[p] = values[p] + out[p + 1]: a suffix sum, so each wait saw a finished value
    assert out.tolist() == torch.flip(torch.cumsum(torch.flip(values, (0,)), 0), (0,)).tolist()
    assert counters.tolist() == [1] * n                  # one signal a program, not a thread


def test_rounds_of_grid_barriers_on_one_counter_never_mix_rounds():
    n, n_rounds = 4, 3
    counter = torch.zeros(1, dtype=torch.int32)
    slots = torch.zeros(n, dtype=torch.int32)
    out = torch.zeros(n_rounds * n, dtype=torch.int32)
    threaded(probes.rounds, (n,), counter, slots, out, n, n_rounds, BLOCK=8, IS_INTERP=True,
             timeout_s=120)
    want = [sum(r * 1000 + p for p in range(n)) for r in range(n_rounds)]
    assert out.view(n_rounds, n).tolist() == [[w] * n for w in want]
    assert counter.item() == 2 * n_rounds * n


def test_a_doorbell_is_answered_beat_by_beat_from_another_thread():
    beats = 4
    bell = torch.zeros(1, dtype=torch.int64)
    ack = torch.zeros(1, dtype=torch.int64)
    stamps = torch.full((beats,), -1, dtype=torch.int64)
    acked = []

    def host():
        for e in range(1, beats + 1):
            bell[0] = e                              # the host's plain store
            deadline = time.monotonic() + 30
            while ack.item() < e and time.monotonic() < deadline:
                time.sleep(0.001)
            acked.append(ack.item())

    ringer = threading.Thread(target=host)
    ringer.start()
    threaded(probes.doorbell, (1,), bell, ack, stamps, beats, IS_INTERP=True, timeout_s=60)
    ringer.join(30)
    assert acked == list(range(1, beats + 1))
    assert stamps.tolist() == [0] * beats            # every beat stamped (0: no GPU clock here)


def test_a_wait_nobody_signals_is_reported_as_a_deadlock_not_a_hang():
    counters = torch.zeros(2, dtype=torch.int32)
    values = torch.ones(2, dtype=torch.int32)
    out = torch.zeros(2, dtype=torch.int32)
    # Program 0 waits for program 1, which is not in the grid: nobody signals.
    with pytest.raises(Deadlock):
        threaded(probes.chain, (1,), values, counters, out, 2, IS_INTERP=True, timeout_s=1.0)
