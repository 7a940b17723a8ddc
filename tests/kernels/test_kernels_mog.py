"""mog_sample (Triton, both algorithms) against mog_sample_ref: exact indices on fresh random rows,
odd M, ties. "sort" runs at small M here: the interpreter's tl.sort costs seconds per row at 1024."""
import pytest
import torch

from gpu.kernels.mog_sample import mog_sample, mog_sample_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("algo,batch,m,scale,items", [
    ("sort", 9, 50, 0.3, 16), ("sort", 5, 77, 30.0, 16), ("sort", 2, 128, 2.0, 16),
    ("pairwise", 37, 50, 0.3, 16), ("pairwise", 29, 50, 4.0, 32), ("pairwise", 5, 77, 30.0, 64),
    ("pairwise", 3, 1024, 2.0, 32)])
@pytest.mark.slow
def test_mog_sample_matches_ref(algo, batch, m, scale, items):
    g = torch.Generator().manual_seed(batch * m)
    logits = (scale * torch.randn(batch, m, generator=g)).to(DEV)
    u = torch.rand(batch, m, generator=g).to(DEV)
    out = torch.full((batch,), -7, dtype=torch.int32, device=DEV)
    k = mog_sample(logits, u, out=out, items=items, algo=algo)
    assert k is out and torch.equal(k, mog_sample_ref(logits, u))


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sort", "pairwise"])
def test_mog_sample_filter_and_ties(algo):
    # Integer logits tie often; U near 1 gives dropped items a large Gumbel bonus, so any item the
    # kernel failed to drop would win the argmax somewhere.
    g = torch.Generator().manual_seed(7)
    logits = torch.randint(-3, 4, (10, 50), generator=g).float().to(DEV)
    u = (1.0 - 1e-6 * torch.rand(10, 50, generator=g)).to(DEV)
    k = mog_sample(logits, u, algo=algo)
    assert torch.equal(k, mog_sample_ref(logits, u))
    k1 = mog_sample(logits, u, top_p=1e-6, algo=algo)     # only the first of the top-tied items survives
    assert torch.equal(k1, logits.argmax(-1).to(torch.int32))


def test_mog_sample_rejects_bad_args():
    x = torch.randn(2, 8, device=DEV)
    with pytest.raises(AssertionError, match="U"):
        mog_sample(x, torch.rand(2, 9, device=DEV))
    with pytest.raises(AssertionError, match="logits"):
        mog_sample(x.double(), torch.rand(2, 8, device=DEV))
    with pytest.raises(AssertionError, match="bogus"):
        mog_sample(x, torch.rand(2, 8, device=DEV), algo="bogus")
