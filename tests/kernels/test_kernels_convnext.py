"""convnext_step (Triton dwconv+LN, torch pwconvs) against convnext_step_ref, cache included;
chunked calls equal one call over the whole sequence (the cache carries the causal context); the
cache as a strided view (the codec state's [S, C, 6] transposed) and int64 slots."""
import pytest
import torch

from gpu.kernels.convnext_step import convnext_step, convnext_step_ref, dwconv_ln, window_rows
from tests.tensorkit import edit_loop, rel

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
@pytest.mark.slow
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


def dwln_ref(x, cache, slots, p):
    """dwconv_ln in torch, fp32: LayerNorm(dw_b + 7 explicit taps over [cache; x]); cache <- last 6."""
    idx, n_t, n_c = slots.long(), x.shape[1], x.shape[2]
    cat = torch.cat([cache[idx], x], dim=1)
    cache[idx] = cat[:, -6:]
    h = p["dw_b"] + sum(cat[:, k:k + n_t] * p["dw_w"][:, k] for k in range(7))
    return torch.nn.functional.layer_norm(h, (n_c,), p["ln_w"], p["ln_b"], 1e-6)


def strided_caches(cache0, layout):
    """Three equal [S, 6, C] caches: contiguous, [S, C, 6] storage transposed, or rows 2..7 of a
    [S, C, 9] buffer transposed (slot stride 9·C, no dim contiguous)."""
    if layout == "padded":
        out = []
        for _ in range(3):
            buf = torch.full((cache0.shape[0], cache0.shape[2], 9), float("nan"), device=DEV)
            buf[..., 2:8] = cache0.transpose(1, 2)
            out.append(buf[..., 2:8].transpose(1, 2))
        return out
    return [*caches(cache0, layout), caches(cache0, layout)[0]]


@pytest.mark.parametrize("n_c,n_t,rows,layout,slot_list", edit_loop([
    (16, 1, None, "time_major", [4, 0, 2]), (32, 5, 1, "padded", [6, 2, 4]),
    (20, 13, 4, "channel_major", [0, 3, 5]), (24, 9, None, "channel_major", [5, 1, 3]),
    (40, 20, None, "padded", [2, 6, 0]), (48, 7, 3, "time_major", [1, 4]),
    (16, 6, 2, "time_major", [3, 1]), (24, 20, 20, "padded", [5, 0, 4]),
    (48, 2, 8, "channel_major", [2])], 3))
def test_dwconv_ln_window_equals_first_kernel_and_ref(n_c, n_t, rows, layout, slot_list):
    """The sliding-window kernel against the first kernel and torch over two chunks (the second
    reads the cache the first wrote): h within 1e-5, the caches bit-equal, other slots untouched."""
    p, g = make(n_c, 100 * n_c + n_t)
    slots = torch.tensor(slot_list, dtype=torch.int64 if len(slot_list) == 3 else torch.int32, device=DEV)
    cache0 = torch.randn(7, 6, n_c, generator=g).to(DEV)
    c_new, c_old, c_ref = strided_caches(cache0, layout)
    assert layout != "padded" or not (c_new.is_contiguous() or c_new.transpose(1, 2).is_contiguous())
    w = (p["dw_w"], p["dw_b"], p["ln_w"], p["ln_b"])
    for _ in range(2):
        x = torch.randn(len(slot_list), n_t, n_c, generator=g).to(DEV)
        h_new = dwconv_ln(x, c_new, slots, *w, rows=rows)
        h_old = dwconv_ln(x, c_old, slots, *w, window=False)
        h_ref = dwln_ref(x, c_ref, slots, p)
        assert torch.isfinite(h_new).all()
        assert rel(h_new, h_old) < 1e-6 and rel(h_new, h_ref) < 1e-5, (rel(h_new, h_old), rel(h_new, h_ref))
        torch.testing.assert_close(h_new, h_ref, rtol=1e-5, atol=1e-5)
        assert torch.equal(c_new, c_old) and torch.equal(c_new, c_ref)
    untouched = [s for s in range(7) if s not in slot_list]
    assert torch.equal(c_new[untouched], cache0[untouched])


@pytest.mark.parametrize("window", [True, False])
def test_convnext_step_paths_match_ref(window):
    p, g = make(24, 5)
    slots = torch.tensor([2, 0], dtype=torch.int32, device=DEV)
    ck, cr = caches(torch.randn(3, 6, 24, generator=g).to(DEV), "channel_major")
    x = torch.randn(2, 11, 24, generator=g).to(DEV)
    y = call(convnext_step, x, ck, slots, p, window=window, rows=4)
    y_ref = call(convnext_step_ref, x, cr, slots, p)
    assert rel(y, y_ref) < 1e-5 and torch.equal(ck, cr)


def test_window_rows_balanced():
    assert [window_rows(t) for t in (1, 7, 8, 9, 17, 63, 441)] == [1, 7, 8, 9, 9, 16, 16]
    assert window_rows(441, 16) == 16 and window_rows(9, 4) == 3 and window_rows(5, 0) == 5
