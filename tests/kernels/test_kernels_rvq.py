"""rvq_search (Triton) against rvq_search_ref: codes exactly, q and r to fp32 rounding, in place."""
import pytest
import torch

from gpu.kernels.rvq_search import rvq_search, rvq_search_ref, rvq_sqnorm
from tests.tensorkit import rel

DEV = "cuda" if torch.cuda.is_available() else "cpu"




@pytest.mark.parametrize("batch,n_codes,dim,j0,w,precision", [
    (3, 37, 24, 1, 3, "ieee"), (5, 37, 24, 0, 4, "tf32x3"), (17, 70, 40, 4, 1, "ieee"), (3, 37, 24, 2, 2, "tf32x3")])
def test_rvq_search_matches_ref(batch, n_codes, dim, j0, w, precision):
    g = torch.Generator().manual_seed(batch * n_codes + w)
    books = torch.randn(5, n_codes, dim, generator=g).to(DEV)
    sqn = rvq_sqnorm(books)
    r0 = (2.0 * torch.randn(batch, dim, generator=g)).to(DEV)
    q0 = torch.randn(batch, dim, generator=g).to(DEV)
    r, q = r0.clone(), q0.clone()
    out = torch.full((batch, w), -7, dtype=torch.int32, device=DEV)
    codes, q_k, r_k = rvq_search(r, q, books, sqn, j0, w, out=out, precision=precision)
    r_ref, q_ref = r0.clone(), q0.clone()
    codes_ref, _, _ = rvq_search_ref(r_ref, q_ref, books, sqn, j0, w)
    assert codes is out and q_k is q and r_k is r
    assert torch.equal(codes, codes_ref)
    assert rel(r, r_ref) < 1e-5 and rel(q, q_ref) < 1e-5
    assert torch.allclose(r + q, r0 + q0, atol=1e-4)   # r + q is invariant


def test_rvq_search_rejects_bad_args():
    books = torch.randn(3, 8, 16, device=DEV)
    r, q = torch.randn(2, 16, device=DEV), torch.randn(2, 16, device=DEV)
    with pytest.raises(AssertionError):
        rvq_search(r, q, books, rvq_sqnorm(books), 2, 2)
    with pytest.raises(AssertionError, match="q"):
        rvq_search(r, q[:, :8], books, rvq_sqnorm(books), 0, 1)
