"""copy_rows (Triton) against copy_rows_ref: whole rows and counted rows, fp32, bf16 and int64
state, int32 and int64 indexes, a padded index (the last copy repeated), rows longer than one
block; and that nothing outside the named rows changes.

Bugs these catch: a layer stride taken from the wrong tensor (a snapshot's rows are fewer than
the state's slots, so every layer past the first would land in another slot); a count read past
the source's positions; a copy that spills one block past its row into the neighbour's."""
import pytest
import torch

from gpu.kernels.row_copy import BLOCK, copy_rows, copy_rows_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _pair(layers, slots, entries, row, src_row, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    make = (lambda *s: torch.randint(-50, 50, s, generator=g)) if dtype == torch.int64 else \
        (lambda *s: torch.randn(s, generator=g))
    dst = make(layers, slots, *row).to(dtype).to(DEV)
    src = make(layers, entries, *src_row).to(dtype).to(DEV)
    return dst, src


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
@pytest.mark.parametrize("row", [(3, 5), (BLOCK + 7,), (2, 3, 4)])
def test_whole_rows_match_ref(row, index, dtype):
    dst, src = _pair(3, 6, 2, row, row, dtype, len(row))
    d = torch.tensor([4, 1, 2, 2], dtype=index, device=DEV)       # the last repeated: padding
    s = torch.tensor([1, 0, 1, 1], dtype=index, device=DEV)
    want = dst.clone()
    copy_rows_ref(want, d, src, s)
    copy_rows(dst, d, src, s)
    assert torch.equal(dst, want)
    assert torch.equal(dst[:, 4], src[:, 1]) and torch.equal(dst[:, 1], src[:, 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [1, 3])
def test_counted_rows_match_ref(heads, dtype):
    # a state of 9 positions a slot, snapshots of 5: counts 0, 3, 5 and one past the snapshot
    dst, src = _pair(2, 4, 3, (9, heads, 8), (5, heads, 8), dtype, heads)
    d = torch.tensor([0, 3, 1, 2], device=DEV)
    s = torch.tensor([2, 0, 1, 1], device=DEV)
    counts = torch.tensor([3, 5, 0, 7], device=DEV)
    want = dst.clone()
    copy_rows_ref(want, d, src, s, counts)
    copy_rows(dst, d, src, s, counts)
    assert torch.equal(dst, want)
    assert torch.equal(dst[:, 1], want[:, 1])               # count 0: the row untouched
    assert torch.equal(dst[:, 2, :5], src[:, 1])           # past the snapshot: its 5 only


def test_refuses_mismatched_tensors():
    dst, src = _pair(2, 4, 2, (3, 8), (3, 8), torch.float32, 0)
    d = s = torch.tensor([0], device=DEV)
    with pytest.raises(AssertionError, match="dtypes differ"):
        copy_rows(dst, d, src.double(), s)
    with pytest.raises(AssertionError, match="shapes differ"):
        copy_rows(dst, d, src[:, :, :, :4].contiguous(), s)
    with pytest.raises(AssertionError, match="whole rows need equal rows"):
        copy_rows(dst, d, src[:, :, :2].contiguous(), s)
    with pytest.raises(AssertionError, match="row must be contiguous"):
        copy_rows(dst.transpose(2, 3), d, src.transpose(2, 3), s)
