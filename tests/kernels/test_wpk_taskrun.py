"""A task-table program (`gpu/wpk/taskrun.py`) in the threaded interpreter: emitted rows walked by
programs that wait on each other, beat after beat on counters never reset, against PyTorch.

Bugs these catch: a row read at the wrong stride or queue offset, a wait skipped or aimed at
the wrong epoch (a layer summed before its input is complete: wrong values, or a second beat
that runs on the first beat's counts), a tile written outside its range, a signal counted per
thread; and a table the validator would reject being run at all."""
from __future__ import annotations

import pytest
import torch

from gpu.wpk import taskrun as T
from gpu.wpk.schedule import run, validate
from gpu.wpk.sync import interp
from gpu.wpk.testing import threaded

pytestmark = pytest.mark.skipif(not interp(), reason="the interpreter's threaded runs")


@pytest.mark.parametrize("layers,n,tile,queues", [(3, 12, 4, 2), (4, 10, 4, 3), (2, 8, 8, 1)])
def test_a_task_table_program_computes_what_pytorch_does_beat_after_beat(layers, n, tile,
                                                                         queues):
    table = T.affine_layers(layers, n, tile, queues)
    assert validate(table) == []
    run(table, beats=2)                          # the host's play of the same table finishes
    rows, starts = table.emit()
    rows, starts = torch.from_numpy(rows), torch.from_numpy(starts)
    counters = torch.zeros(table.n_counters, dtype=torch.int32)
    for beat in (1, 2):
        x = torch.randn(n, generator=torch.Generator().manual_seed(beat))
        arena = torch.zeros((layers + 1) * n)
        arena[:n] = x
        threaded(T.task_program, (queues,), rows, starts, counters, arena, beat, n, TILE=tile,
                 BLOCK_N=16, IS_INTERP=True, timeout_s=120)
        want = T.affine_reference(x, layers).flatten()
        torch.testing.assert_close(arena, want, rtol=1e-6, atol=1e-5)
        assert counters.tolist() == [beat * (-(-n // tile))] * layers
