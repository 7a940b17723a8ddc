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
from hypothesis import given, settings, strategies as st

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

XL = torch.randn(5, 40, 160, generator=G)          # long rows, several EW tiles
YL = torch.randn(40, 1, generator=G)
IL = torch.randint(0, 40, (7,), generator=G)

CASES = {
    "long rows: gather, broadcast, scatter": lambda: (
        XL.index_select(1, IL) * 2.0, XL + YL, torch.zeros(5, 40, 160).index_copy_(
            1, torch.arange(39, -1, -1), XL), torch.arange(320).float().view(2, 160) + 0),
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


def _run_lowered(fn, named: dict) -> tuple[list, list]:
    """(the lowered program's outputs, PyTorch's) of `fn` over the `named` inputs."""
    graph = trace(lambda: fn(), named)
    low = lower(graph, 3, 3)
    rows_t, starts = (torch.from_numpy(a) for a in low.table.emit())
    counters = torch.zeros(low.table.n_counters, dtype=torch.int32)
    arena, weights = low.load({k: t for k, (_, t) in named.items()})
    threaded(T.task_program, (3,), rows_t, starts, counters, arena, weights,
             torch.from_numpy(low.args), 1, 0, TILE=16, BLOCK_N=16, IS_INTERP=True,
             timeout_s=120)
    want = fn()
    return low.outputs(arena), [w.float() for w in (want if isinstance(want, tuple) else [want])]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_lowered_op_computes_what_pytorch_does(name):
    fn = CASES[name]
    named = {"x": (Storage.INPUT, X), "y": (Storage.INPUT, Y), "i": (Storage.INPUT, I),
             "m": (Storage.INPUT, M)}
    got, want = _run_lowered(fn, named)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


@st.composite
def _broadcast_pair(draw):
    """An output shape of rank 1-4, and two operands that broadcast to it: each keeps a
    suffix of its dims, some of them 1, and may be a permuted (non-contiguous) view."""
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))

    def operand():
        keep = draw(st.integers(1, len(shape)))
        dims = [n if draw(st.booleans()) else 1 for n in shape[len(shape) - keep:]]
        t = torch.randn(*dims, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
        if len(dims) >= 2 and draw(st.booleans()):      # a transposed view of a contiguous one
            t = t.transpose(-1, -2).contiguous().transpose(-1, -2)
        return t
    return shape, operand(), operand(), draw(st.sampled_from(
        ["add", "sub", "mul", "div", "le", "where"]))


@settings(max_examples=25, deadline=None)
@given(_broadcast_pair())
def test_broadcast_operands_of_any_rank_and_layout_meet_at_the_right_elements(case):
    """Property: an operand's strides are aligned to the output's dimensions from the right,
    a broadcast dimension's stride is 0, and a permuted view is read at its own strides. Catches
    strides aligned from the left, a size-1 dimension read at its stride, and a view read as
    if it were contiguous."""
    shape, a, b, op = case
    fns = {"add": lambda: torch.add(a, b, alpha=0.75).expand(shape) + 0,
           "sub": lambda: (a - b).expand(shape) * 1.0,
           "mul": lambda: (a * b).expand(shape) * 1.0,
           "div": lambda: (a / (b.abs() + 0.5)).expand(shape) * 1.0,
           "le": lambda: (a <= b).float().expand(shape) * 1.0,
           "where": lambda: torch.where(a > 0, a, b).expand(shape) * 1.0}
    got, want = _run_lowered(fns[op], {"a": (Storage.INPUT, a), "b": (Storage.INPUT, b)})
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=2, max_size=4), st.data())
def test_gathers_and_scatters_index_the_dimension_they_name(shape, data):
    """Property: `index_select` and `index_copy_` along any dimension, with any indices (a
    scatter's distinct), read and write exactly the elements PyTorch does. Catches an index
    term put on the wrong operand or multiplied by another dimension's stride."""
    dim = data.draw(st.integers(0, len(shape) - 1))
    n = shape[dim]
    picks = torch.tensor(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=5)))
    order = torch.tensor(data.draw(st.permutations(range(n))))
    src = torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape)))

    def fn():
        gathered = src.index_select(dim, picks) * 1.0
        dst = torch.zeros(*shape)
        dst.index_copy_(dim, order, src * 2)
        return gathered, dst
    named = {"src": (Storage.INPUT, src), "picks": (Storage.INPUT, picks),
             "order": (Storage.INPUT, order)}
    got, want = _run_lowered(fn, named)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
