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
NO_ARGS = torch.zeros(T.ARGS, dtype=torch.int32)


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
        threaded(T.task_program, (queues,), rows, starts, counters, arena, arena, NO_ARGS, beat, n,
                 TILE=tile, BLOCK_N=16, IS_INTERP=True, timeout_s=120)
        want = T.affine_reference(x, layers).flatten()
        torch.testing.assert_close(arena, want, rtol=1e-6, atol=1e-5)
        assert counters.tolist() == [beat * (-(-n // tile))] * layers


@pytest.mark.parametrize("m,d,h,queues,layers,wdtype,split_k", [
    (5, 24, 40, 3, 2, torch.float32, 1), (9, 16, 64, 4, 1, torch.float32, 3),
    (3, 20, 100, 1, 2, torch.float32, 2), (18, 32, 48, 5, 2, torch.bfloat16, 1),
    (7, 32, 160, 4, 2, torch.bfloat16, 3)])
def test_library_task_ops_run_feed_forward_half_steps_as_pytorch_does(m, d, h, queues, layers,
                                                                      wdtype, split_k):
    """GEMM and add + layer norm as task ops with an argument table: Conformer feed-forward
    half-steps (LN, GEMM + bias + SiLU, GEMM + bias, x + ½·y then LN), each feeding the next,
    over ragged tiles (rows and columns that do not fill a tile), every intermediate of every
    half-step against PyTorch's, two beats; fp32 weights at 1e-5, bf16 weights (x's tile
    rounded to bf16 as the reference's is) at 1e-4. Catches a record read at the wrong stride,
    a tile's rows or columns misplaced or masked wrong, a bias or activation skipped, the
    residual's alpha mis-scaled, a weight read from the wrong arena, a tile that starts
    before all of its input rows are written (across half-steps too), and split-K parts that
    overlap, leave part of K out, or are summed short."""
    block = T.ffn_chain(m, d, h, queues, layers, split_k=split_k)
    assert validate(block.table) == []
    run(block.table, beats=2)
    rows, starts = (torch.from_numpy(a) for a in block.table.emit())
    args = torch.from_numpy(block.args)
    counters = torch.zeros(block.table.n_counters, dtype=torch.int32)
    tol = 1e-5 if wdtype == torch.float32 else 1e-4
    for beat in (1, 2):
        g = torch.Generator().manual_seed(10 * beat + m)
        arena = torch.zeros(block.arena)
        weights = torch.zeros(block.weights, dtype=wdtype)
        for name, (_, shape) in block.layout.items():
            if name == "x.0" or name.split(".")[0] in ("b1", "b2", "g1", "be1", "g2", "be2"):
                v = block.view(arena, name)
                v.copy_(torch.randn(shape, generator=g) * (0.3 if name[0] == "b" else 1.0))
        for name, (_, shape) in block.wlayout.items():
            block.wview(weights, name).copy_(torch.randn(shape, generator=g) * 0.3)
        threaded(T.task_program, (queues,), rows, starts, counters, arena, weights, args, beat,
                 0, TILE=16, BLOCK_N=16, IS_INTERP=True, timeout_s=240)
        for layer in range(layers):
            for name, ref in T.ffn_reference(block, arena, weights, layer).items():
                got = block.view(arena, f"x.{layer + 1}" if name == "x" else f"{name}.{layer}")
                got = got.sum(0) if name == "h2" else got     # split-K partials
                torch.testing.assert_close(got, ref, rtol=tol, atol=tol,
                                           msg=lambda e, n=name, l=layer: f"{n}.{l}: {e}")
        tiles = [sum(t.signal == k for q in block.table.queues for t in q)
                 for k in range(block.table.n_counters)]
        assert counters.tolist() == [beat * n for n in tiles]
