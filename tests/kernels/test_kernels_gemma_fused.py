"""The talker's fused Gemma steps against their PyTorch twins on fresh random inputs (fp32, under
1e-5 relative), and the twins against the model's own code bit for bit:
  - residual_rms_norm: x + post_norm(y), then the next sublayer's norm of the sum, one launch;
  - gelu_mul: gelu_tanh(gate)·up from the fused [gate | up] matmul output, one launch."""
import pytest
import torch

from gpu.kernels.gelu_mul import gelu_mul, gelu_mul_ref
from gpu.kernels.rms_norm import residual_rms_norm, residual_rms_norm_ref
from gpu.model.talker.text import GatedMLP, RMSNorm, add_normed

DEV = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6


def _randn(shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=g)).to(DEV)


@pytest.mark.parametrize("shape", [(3, 1152), (2, 2, 1152), (5, 72), (2, 3, 1, 100)])
@pytest.mark.parametrize("with_next", [True, False])
def test_residual_rms_norm_matches_ref(shape, with_next):
    seed = shape[-1] + len(shape) + with_next
    x, y = _randn(shape, seed, 2.0), _randn(shape, seed + 1, 5.0)
    w1, w2 = _randn(shape[-1:], seed + 2, 0.5), _randn(shape[-1:], seed + 3, 0.5)
    w_next = w2 if with_next else None
    xs, h = residual_rms_norm(x, y, w1, EPS, w_next)
    xs_ref, h_ref = residual_rms_norm_ref(x, y, w1, EPS, w_next)
    assert xs.shape == x.shape and xs.is_contiguous()
    torch.testing.assert_close(xs, xs_ref, rtol=1e-5, atol=1e-6)
    if with_next:
        torch.testing.assert_close(h, h_ref, rtol=1e-5, atol=1e-6)
    else:
        assert h is None
    assert not torch.equal(xs, x)                    # the residual really added something


def test_residual_rms_norm_takes_row_strided_inputs_and_refuses_bad_ones():
    wide = _randn((4, 3 * 64), 7)
    x, y = wide[:, :64], wide[:, 64:128]            # rows of a wider tensor: one row stride
    w = _randn((64,), 8)
    xs, h = residual_rms_norm(x, y, w, EPS, w)
    xs_ref, h_ref = residual_rms_norm_ref(x, y, w, EPS, w)
    torch.testing.assert_close(xs, xs_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h, h_ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(AssertionError, match="y"):
        residual_rms_norm(x, y[:, :32], w, EPS)
    with pytest.raises(AssertionError, match="x"):
        residual_rms_norm(x.bfloat16(), y, w, EPS)
    with pytest.raises(AssertionError, match="w_next"):
        residual_rms_norm(x, y, w, EPS, w[:32])


@pytest.mark.parametrize("shape", [(3, 2 * 4608), (2, 2, 2 * 4608), (7, 2 * 33), (1, 1, 1, 2 * 128)])
def test_gelu_mul_matches_ref(shape):
    gu = _randn(shape, shape[-1] + len(shape), 3.0)
    gu.view(-1)[:4] = torch.tensor([40.0, -40.0, 0.0, 1e-3])    # saturated tanh, zero, tiny
    out = gelu_mul(gu)
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.is_contiguous()
    # atol 1e-5 on outputs up to ~100: where tanh(t) rounds to −1 in fp32 (t < −9) torch's
    # GELU is exactly 0, while g·σ(2t) keeps the ~1e-8·|g| tail, times |up| up to ~10
    torch.testing.assert_close(out, gelu_mul_ref(gu), rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out).all()


def test_gelu_mul_refuses_an_odd_width_and_other_dtypes():
    with pytest.raises(AssertionError, match="gate"):
        gelu_mul(_randn((2, 7), 1))
    with pytest.raises(AssertionError, match="dtype"):
        gelu_mul(_randn((2, 8), 1).bfloat16())


@torch.no_grad()
def test_twins_are_the_models_math():
    """add_normed on the reference path equals its twin bit for bit; GatedMLP its twin up to
    torch's own GELU (a strided view of the same values may take another vector path)."""
    norm, then = RMSNorm(96, EPS).to(DEV), RMSNorm(96, EPS).to(DEV)
    norm.weight.copy_(_randn((96,), 1, 0.3))
    then.weight.copy_(_randn((96,), 2, 0.3))
    x, y = _randn((4, 96), 3), _randn((4, 96), 4)
    xs, h = add_normed(x, y, norm, then)
    xs_ref, h_ref = residual_rms_norm_ref(x, y, norm.weight, EPS, then.weight)
    assert torch.equal(xs, xs_ref) and torch.equal(h, h_ref)
    mlp = GatedMLP(96, 40).to(DEV)
    gu = torch.cat([mlp.gate_proj(x), mlp.up_proj(x)], -1)
    torch.testing.assert_close(mlp(x), mlp.down_proj(gelu_mul_ref(gu)), rtol=1e-6, atol=1e-7)
