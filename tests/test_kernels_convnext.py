"""convnext_step (Triton dwconv+LN, torch pwconvs) against convnext_step_ref, cache included;
chunked calls equal one call over the whole sequence (the cache carries the causal context); the
cache as a strided view (the codec state's [S, C, 6] transposed) and int64 slots."""
import pytest
import torch

from gpu.kernels.convnext_step import convnext_step, convnext_step_ref
from tests.tensorkit import rel

DEV = "cuda" if torch.cuda.is_available() else "cpu"



def make(n_c, seed):
    g = torch.Generator().manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=g)
    p = dict(dw_w=rn(n_c, 7) / 7 ** 0.5, dw_b=0.1 * rn(n_c), ln_w=1 + 0.2 * rn(n_c), ln_b=0.1 * rn(n_c),
             pw1_w=rn(4 * n_c, n_c) / n_c ** 0.5, pw1_b=0.1 * rn(4 * n_c),
             pw2_w=rn(n_c, 4 * n_c) / (4 * n_c) ** 0.5, pw2_b=0.1 * rn(n_c))
    return {k: v.to(DEV) for k, v in p.items()}, g


def call(fn, x, cache, slots, p, **kw):
    return fn(x, cache, slots, p["dw_w"], p["dw_b"], p["ln_w"], p["ln_b"], p["pw1_w"], p["pw1_b"],
              p["pw2_w"], p["pw2_b"], **kw)


def caches(cache0, layout):
    """Two equal [S, 6, C] caches: contiguous, or views of [S, C, 6] storage (the codec state)."""
    if layout == "time_major":
        return cache0.clone(), cache0.clone()
    return tuple(cache0.transpose(1, 2).contiguous().transpose(1, 2) for _ in range(2))


@pytest.mark.parametrize("n_c,n_t,layout,index", [
    (24, 9, "time_major", torch.int32), (40, 3, "time_major", torch.int32),
    (12, 63, "time_major", torch.int32), (20, 1, "time_major", torch.int32),
    (24, 9, "channel_major", torch.int64), (20, 1, "channel_major", torch.int32),
    (12, 63, "channel_major", torch.int64), (40, 3, "time_major", torch.int64)])
def test_convnext_step_matches_ref(n_c, n_t, layout, index):
    p, g = make(n_c, n_c * n_t)
    slot_list = [4, 0, 2]
    slots = torch.tensor(slot_list, dtype=index, device=DEV)
    cache0 = torch.randn(6, 6, n_c, generator=g).to(DEV)
    ck, cr = caches(cache0, layout)
    assert ck.is_contiguous() == (layout == "time_major")
    for _ in range(2):
        x = torch.randn(3, n_t, n_c, generator=g).to(DEV)
        out = torch.full_like(x, float("nan"))
        y = call(convnext_step, x, ck, slots, p, out=out)
        y_ref = call(convnext_step_ref, x, cr, slots, p)
        assert y is out and torch.isfinite(y).all()
        assert rel(y, y_ref) < 1e-5, rel(y, y_ref)
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
        assert torch.equal(ck, cr)
    untouched = [s for s in range(6) if s not in slot_list]
    assert torch.equal(ck[untouched], cache0[untouched])


def test_convnext_step_chunked_equals_one_shot():
    p, g = make(16, 1)
    x = torch.randn(2, 13, 16, generator=g).to(DEV)
    slots = torch.tensor([1, 0], dtype=torch.int32, device=DEV)
    c_one, c_chunk = torch.zeros(2, 6, 16, device=DEV), torch.zeros(2, 6, 16, device=DEV)
    y_one = call(convnext_step, x, c_one, slots, p)
    y_chunk = torch.cat([call(convnext_step, x[:, a:b].contiguous(), c_chunk, slots, p)
                         for a, b in ((0, 2), (2, 9), (9, 13))], dim=1)
    assert rel(y_chunk, y_one) < 1e-6 and torch.equal(c_one, c_chunk)


def test_convnext_step_rejects_bad_args():
    p, _ = make(8, 2)
    x = torch.randn(2, 5, 8, device=DEV)
    with pytest.raises(AssertionError, match="cache"):
        call(convnext_step, x, torch.zeros(3, 8, 6, device=DEV), torch.tensor([0, 1], dtype=torch.int32, device=DEV), p)
    cache, slots = torch.randn(3, 6, 8, device=DEV), torch.tensor([0, 1], device=DEV)
    before = cache.clone()
    with pytest.raises(AssertionError, match="pw1_w"):       # before the kernels move the cache
        call(convnext_step, x, cache, slots, p | {"pw1_w": p["pw1_w"][:, :4]})
    assert torch.equal(cache, before)
    if DEV == "cpu":    # slot values are checked only where that costs no device sync
        with pytest.raises(AssertionError, match="repeat"):
            call(convnext_step, x, torch.zeros(3, 6, 8, device=DEV), torch.tensor([1, 1], dtype=torch.int32, device=DEV), p)
