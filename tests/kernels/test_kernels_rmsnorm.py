"""rms_norm (Triton) against rms_norm_ref on fresh random rows in both model conventions, fp32 and
bf16, 2-D to 4-D and row-strided inputs; and rms_norm_ref against the models' own functions,
bit for bit, so the twin is provably their math."""
import pytest
import torch

from gpu.kernels.rms_norm import rms_norm, rms_norm_ref
from gpu.model.talker.text import RMSNorm as TalkerRMSNorm
from gpu.model.thinker import rms_norm as thinker_rms_norm

DEV = "cuda" if torch.cuda.is_available() else "cpu"
MODES = [(True, False), (False, True)]          # (plus_one, round_first): talker, thinker
EPS = 1e-6


def _inputs(shape, dtype, wdtype, seed, *, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    x = (scale * torch.randn(shape, generator=g)).to(dtype).to(DEV)
    w = (1.0 + 0.5 * torch.randn(shape[-1], generator=g)).to(wdtype).to(DEV)
    return x, w


def _assert_close(out, ref, dtype):
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    else:   # an occasional 1-ulp flip where a value sits on a bf16 rounding boundary
        torch.testing.assert_close(out.float(), ref.float(), rtol=1e-2, atol=1e-5)


@pytest.mark.parametrize("plus_one,round_first", MODES + [(False, False), (True, True)])
@pytest.mark.parametrize("dtype,wdtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                          (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("rows,dim", [(37, 72), (5, 1152), (2, 4480)])
def test_rms_norm_matches_ref(rows, dim, dtype, wdtype, plus_one, round_first):
    x, w = _inputs((rows, dim), dtype, wdtype, rows * dim)
    out = rms_norm(x, w, EPS, plus_one=plus_one, round_first=round_first)
    ref = rms_norm_ref(x, w, EPS, plus_one=plus_one, round_first=round_first)
    assert out.dtype == dtype and out.is_contiguous()
    _assert_close(out, ref, dtype)


@pytest.mark.parametrize("plus_one,round_first", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 3, 72), (2, 3, 5, 72), (3, 1, 1280), (512,)])
def test_rms_norm_leading_shapes(shape, dtype, plus_one, round_first):
    x, w = _inputs(shape, dtype, dtype, len(shape) * shape[-1])
    out = rms_norm(x, w, 1e-5, plus_one=plus_one, round_first=round_first)
    assert out.shape == x.shape
    _assert_close(out, rms_norm_ref(x, w, 1e-5, plus_one=plus_one, round_first=round_first), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_row_strided(dtype):
    # Heads sliced out of a fused qkv row [T, 6·72]: one head per token ([T, 72], row stride 432)
    # and a [T, 1, 72] slice collapse to one row stride and run without a copy; [T, 4, 72] has two
    # row strides (432, 72), which the launcher refuses rather than copy.
    x, w = _inputs((7, 6 * 72), dtype, dtype, 11)
    for part in (x[:, 72:144], x[:, 144:216].view(7, 1, 72)):
        for plus_one, round_first in MODES:
            out = rms_norm(part, w[:72], EPS, plus_one=plus_one, round_first=round_first)
            assert out.shape == part.shape and out.is_contiguous()
            ref = rms_norm_ref(part, w[:72], EPS, plus_one=plus_one, round_first=round_first)
            _assert_close(out, ref, dtype)
    with pytest.raises(AssertionError, match="collapse"):
        rms_norm(x[:, :4 * 72].view(7, 4, 72), w[:72], EPS, plus_one=True, round_first=False)


def test_rms_norm_rejects_bad_args():
    x = torch.randn(4, 72, device=DEV)
    w = torch.randn(72, device=DEV)
    with pytest.raises(AssertionError, match="weight"):
        rms_norm(x, torch.randn(71, device=DEV), EPS, plus_one=True, round_first=False)
    with pytest.raises(AssertionError, match="x"):
        rms_norm(x.double(), w, EPS, plus_one=True, round_first=False)
    with pytest.raises(AssertionError, match="stride 1"):
        rms_norm(torch.randn(72, 4, device=DEV).t(), w, EPS, plus_one=True, round_first=False)
    with pytest.raises(AssertionError, match="collapse"):
        rms_norm(torch.randn(4, 6, 72, device=DEV)[:, :3], w, EPS, plus_one=True, round_first=False)
    with pytest.raises(AssertionError, match="weight"):
        rms_norm(x, w[None], EPS, plus_one=True, round_first=False)


def test_rms_norm_empty_rows():
    out = rms_norm(torch.empty(0, 3, 72, device=DEV), torch.ones(72, device=DEV), EPS,
                   plus_one=False, round_first=True)
    assert out.shape == (0, 3, 72)


@pytest.mark.parametrize("dtype,wdtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                          (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("shape", [(3, 72), (2, 5, 1152), (2, 4480), (2, 2, 3, 512)])
def test_ref_is_talker_rmsnorm(shape, dtype, wdtype):
    x, w = _inputs(shape, dtype, wdtype, 3 + shape[-1])
    norm = TalkerRMSNorm(shape[-1], 1e-6).to(device=DEV, dtype=wdtype)
    with torch.no_grad():
        norm.weight.copy_(w - 1.0)
        model = norm(x)
    assert torch.equal(model, rms_norm_ref(x, norm.weight.detach(), 1e-6, plus_one=True, round_first=False))


@pytest.mark.parametrize("dtype,wdtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                          (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("shape", [(3, 72), (2, 5, 1152), (2, 4480), (2, 2, 3, 1280)])
def test_ref_is_thinker_rms_norm(shape, dtype, wdtype):
    # bf16 x with fp32 w is left out: torch promotes the thinker's product to fp32, the kernel
    # (and so its twin) returns x.dtype.
    x, w = _inputs(shape, dtype, wdtype, 5 + shape[-1])
    model = thinker_rms_norm(x, w, 1e-5)
    assert torch.equal(model, rms_norm_ref(x, w, 1e-5, plus_one=False, round_first=True))
