"""rvq_search (Triton) against rvq_search_ref: codes exactly, q and r to fp32 rounding, in place;
as w + 1 launches and as one chained launch (grid barriers between steps, programs on threads
in the interpreter)."""
import pytest
import torch

from gpu.kernels.rvq_search import _rvq_kernel, rvq_launch, rvq_search, rvq_search_ref, rvq_sqnorm
from gpu.wpk.sync import interp
from tests.tensorkit import rel

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _case(batch, n_codes, dim, w):
    g = torch.Generator().manual_seed(batch * n_codes + w)
    books = torch.randn(5, n_codes, dim, generator=g).to(DEV)
    r0 = (2.0 * torch.randn(batch, dim, generator=g)).to(DEV)
    q0 = torch.randn(batch, dim, generator=g).to(DEV)
    return books, rvq_sqnorm(books), r0, q0


def _check(codes, out, q_k, r_k, r, q, r0, q0, books, sqn, j0, w):
    r_ref, q_ref = r0.clone(), q0.clone()
    codes_ref, _, _ = rvq_search_ref(r_ref, q_ref, books, sqn, j0, w)
    assert codes is out and q_k is q and r_k is r
    assert torch.equal(codes, codes_ref)
    assert rel(r, r_ref) < 1e-5 and rel(q, q_ref) < 1e-5
    assert torch.allclose(r + q, r0 + q0, atol=1e-4)   # r + q is invariant


@pytest.mark.parametrize("batch,n_codes,dim,j0,w,precision", [
    (3, 37, 24, 1, 3, "ieee"), (5, 37, 24, 0, 4, "tf32x3"), (17, 70, 40, 4, 1, "ieee"), (3, 37, 24, 2, 2, "tf32x3")])
def test_rvq_search_matches_ref(batch, n_codes, dim, j0, w, precision):
    books, sqn, r0, q0 = _case(batch, n_codes, dim, w)
    r, q = r0.clone(), q0.clone()
    out = torch.full((batch, w), -7, dtype=torch.int32, device=DEV)
    codes, q_k, r_k = rvq_search(r, q, books, sqn, j0, w, out=out, precision=precision)
    _check(codes, out, q_k, r_k, r, q, r0, q0, books, sqn, j0, w)


@pytest.mark.skipif(not interp(), reason="the interpreter's threaded runs (the device runs "
                    "the chain in test_rvq_chain_on_device)")
@pytest.mark.parametrize("batch,j0,w", [(5, 0, 4), (17, 1, 3), (3, 4, 1)])
def test_rvq_chain_matches_ref_on_threads(batch, j0, w):
    """Catches a step reading r, q or partials a neighbour split has not written yet, or a
    buffer overwritten while another split still reads it: the chain's only syncs are its
    barriers (the launch-per-step form has the launch boundary)."""
    from gpu.wpk.testing import threaded
    books, sqn, r0, q0 = _case(batch, 37, 24, w)
    r, q = r0.clone(), q0.clone()
    out = torch.full((batch, w), -7, dtype=torch.int32)
    launch, _ = rvq_launch(r, q, books, sqn, j0, w, out=out, precision="ieee", block_b=4,
                           block_n=16, chain=True)
    assert launch.grid[1] > 1                         # the splits do meet at barriers
    meta = dict(launch.meta)
    meta.pop("num_warps")
    threaded(_rvq_kernel, launch.grid, *launch.args_for(0, launch.steps), **meta, timeout_s=120)
    _check(out, out, q, r, r, q, r0, q0, books, sqn, j0, w)


@pytest.mark.gpu
@pytest.mark.parametrize("batch,w,blocks", [(300, 22, dict(block_b=32, block_n=128)),
                                            (120, 4, {}), (7, 1, {})])
def test_rvq_chain_on_device(batch, w, blocks):
    books = torch.randn(31, 1024, 512, device="cuda")
    sqn = rvq_sqnorm(books)
    r0, q0 = torch.randn(batch, 512, device="cuda"), torch.zeros(batch, 512, device="cuda")
    r, q = r0.clone(), q0.clone()
    out = torch.empty(batch, w, dtype=torch.int32, device="cuda")
    codes, q_k, r_k = rvq_search(r, q, books, sqn, 3, w, out=out, precision="ieee",
                                   chain=True, **blocks)
    r1, q1 = r0.clone(), q0.clone()
    step_codes, _, _ = rvq_search(r1, q1, books, sqn, 3, w, precision="ieee", **blocks)
    assert torch.equal(codes, step_codes)          # same body, same order of sums
    assert torch.equal(r, r1) and torch.equal(q, q1)


def test_rvq_search_rejects_bad_args():
    books = torch.randn(3, 8, 16, device=DEV)
    r, q = torch.randn(2, 16, device=DEV), torch.randn(2, 16, device=DEV)
    with pytest.raises(AssertionError):
        rvq_search(r, q, books, rvq_sqnorm(books), 2, 2)
    with pytest.raises(AssertionError, match="q"):
        rvq_search(r, q[:, :8], books, rvq_sqnorm(books), 0, 1)
