"""mog_sample (Triton) against mog_sample_ref: exact indices on fresh random rows, odd M, ties."""
import pytest
import torch

from gpu.kernels.mog_sample import mog_sample, mog_sample_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("batch,m,scale", [(37, 50, 0.3), (29, 50, 4.0), (5, 77, 30.0), (3, 1024, 2.0)])
def test_mog_sample_matches_ref(batch, m, scale):
    g = torch.Generator().manual_seed(batch * m)
    logits = (scale * torch.randn(batch, m, generator=g)).to(DEV)
    u = torch.rand(batch, m, generator=g).to(DEV)
    out = torch.full((batch,), -7, dtype=torch.int32, device=DEV)
    k = mog_sample(logits, u, out=out)
    assert k is out and torch.equal(k, mog_sample_ref(logits, u))


def test_mog_sample_filter_and_ties():
    # Integer logits tie often; U near 1 gives dropped items a large Gumbel bonus, so any item the
    # kernel failed to drop would win the argmax somewhere.
    g = torch.Generator().manual_seed(7)
    logits = torch.randint(-3, 4, (40, 50), generator=g).float().to(DEV)
    u = (1.0 - 1e-6 * torch.rand(40, 50, generator=g)).to(DEV)
    k = mog_sample(logits, u)
    assert torch.equal(k, mog_sample_ref(logits, u))
    k1 = mog_sample(logits, u, top_p=1e-6)       # only the first of the top-tied items survives
    assert torch.equal(k1, logits.argmax(-1).to(torch.int32))


def test_mog_sample_rejects_bad_args():
    x = torch.randn(2, 8, device=DEV)
    with pytest.raises(AssertionError, match="U"):
        mog_sample(x, torch.rand(2, 9, device=DEV))
    with pytest.raises(AssertionError, match="logits"):
        mog_sample(x.double(), torch.rand(2, 8, device=DEV))
