"""The task ops beyond GEMM and add + norm (`gpu/wpk/taskops.py`), each through the path a stage
takes: a small function traced, compiled, lowered (`gpu/wpk/lower_ops.py`) and run as a
task-table program on the threaded interpreter, against PyTorch running the same function.

Bugs these catch: an EW function computing the wrong thing (remainder's sign, a comparison
flipped, alpha dropped), a broadcast stride not zero, a gather or scatter index term on the
wrong operand or dimension, a pad border box overlapping the inside or missing a corner, a
`cat` or `stack` piece at the wrong place, a softmax row not masked, a batched GEMM or
convolution reading a wrong stride, and integers or booleans mis-held as fp32."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpu.wpk import taskrun as T
from gpu.wpk.ir import Storage, trace
from gpu.wpk.lower import lower
from gpu.wpk.sync import interp
from gpu.wpk.testing import threaded

pytestmark = pytest.mark.skipif(not interp(), reason="the interpreter's threaded runs")

G = torch.Generator().manual_seed(11)
X = torch.randn(3, 4, 5, generator=G)
Y = torch.randn(4, 1, generator=G)
I = torch.randint(-9, 9, (3, 4, 5), generator=G)
M = torch.rand(3, 1, 5, generator=G) > 0.5
IDX = torch.tensor([2, 0])
W1 = torch.randn(6, 1, 3, 3, generator=G)
W2 = torch.randn(6, 6, 1, 1, generator=G)
B6 = torch.randn(6, generator=G)
W3 = torch.randn(4, 1, 3, generator=G)

CASES = {
    "add with alpha": lambda: torch.add(X, Y, alpha=0.5),
    "sub and rsub": lambda: torch.rsub(torch.sub(X, Y, alpha=2.0), 1.5),
    "mul, div by a number": lambda: X * Y / 3.0,
    "unary functions": lambda: torch.tanh(torch.sigmoid(X)) + torch.exp(-X.abs()).sqrt()
    + F.relu(X) - F.silu(X).neg(),
    "rsqrt, clamp": lambda: (torch.rsqrt(X.abs() + 1), X.clamp(-0.5, 0.7), X.clamp_max(0.1)),
    "comparisons": lambda: (X > Y).float() + (X <= 0.1).float() * 2 + (X != Y).float() * 4
    + (I == 3).float() * 8 + (I >= 1).float() * 16 + (X < Y).float() * 32,
    "remainder of negative integers": lambda: (torch.remainder(I, 4), torch.remainder(I, -3)),
    "boolean ops and masked_fill": lambda: X.masked_fill(~M | (X > 0), -1.5).masked_fill(
        M & (X < 0), float("-inf")).clamp_min(-1e9),
    "where": lambda: torch.where(M, X, Y),
    "integer arithmetic": lambda: (I + 7) * 3 - torch.arange(5),
    "arange with start and step": lambda: torch.arange(2, 11, 3).float() + X[0, 0, :3],
    "index_select, gather, index": lambda: (
        X.index_select(1, IDX), X.gather(2, I.abs() % 5), X[IDX]),
    "cat and stack": lambda: (torch.cat([X, X * 2], 1), torch.stack([X[:, 0], X[:, 1]], 2)),
    "constant_pad_nd": lambda: F.pad(X, (2, 1, 0, 3), value=0.25),
    "glu": lambda: F.glu(torch.cat([X, Y.expand(3, 4, 5)], 2), -1),
    "softmax": lambda: torch.softmax(X.masked_fill(~M, float("-inf")), -1),
    "bmm": lambda: torch.bmm(X, X.transpose(1, 2)),
    "convolutions": lambda: (F.conv2d(F.conv2d(X[:, None], W1, B6, stride=2), W2, B6),
                             F.conv1d(X, W3, groups=4)),
}


def _scatter():
    s = X.clone()
    s.index_put_((IDX[:, None], torch.tensor([1, 3])), torch.ones(2, 2, 5))
    s.index_copy_(2, torch.tensor([4, 0]), torch.full((3, 4, 2), -2.0))
    s[1].fill_(0.5)
    s[2, 0].zero_()
    s[0, 1].copy_(X[1, 2] * 2)
    return s


CASES["scatters and fills"] = _scatter


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_lowered_op_computes_what_pytorch_does(name):
    fn = CASES[name]
    named = {"x": (Storage.INPUT, X), "y": (Storage.INPUT, Y), "i": (Storage.INPUT, I),
             "m": (Storage.INPUT, M)}
    graph = trace(lambda: fn(), named)
    low = lower(graph, 3, 3)
    rows_t, starts = (torch.from_numpy(a) for a in low.table.emit())
    counters = torch.zeros(low.table.n_counters, dtype=torch.int32)
    arena, weights = low.load({k: t for k, (_, t) in named.items()})
    threaded(T.task_program, (3,), rows_t, starts, counters, arena, weights,
             torch.from_numpy(low.args), 1, 0, TILE=16, BLOCK_N=16, IS_INTERP=True,
             timeout_s=120)
    want = fn()
    want = list(want) if isinstance(want, tuple) else [want]
    for got, ref in zip(low.outputs(arena), want, strict=True):
        torch.testing.assert_close(got, ref.float(), rtol=1e-5, atol=1e-5)
