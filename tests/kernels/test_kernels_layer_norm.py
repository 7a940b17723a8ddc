"""add_layer_norm (Triton) against add_layer_norm_ref at odd widths, fp32 and bf16, alpha ½ and 1,
with and without biases and the second LayerNorm, on contiguous rows and on rows as the model
passes them (the subsampler's kept frame, sliced out of a wider tensor); the sum bit-equal to
torch.add's. Then a tiny perception streamed with every engine hook installed (add+LayerNorm,
fused qkv, rel-pos attention) against its reference path, with and without linear biases."""
import dataclasses

import pytest
import torch

from gpu.engine.decode_ops import TritonDecodeOps
from gpu.kernels.layer_norm import add_layer_norm, add_layer_norm_ref
from gpu.model import perception as P
from gpu.model import perception_weights as PW
from tests.tensorkit import exact_fp32, rel
from tests.kernels.test_kernels_relpos import CHUNKS, stream

DEV = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-5


def _params(n, dtype, g, bias=True):
    w = (1.0 + 0.3 * torch.randn(n, generator=g)).to(dtype).to(DEV)
    b = (0.2 * torch.randn(n, generator=g)).to(dtype).to(DEV) if bias else None
    return w, b


def _assert_close(out, ref, dtype):
    assert out.dtype == ref.dtype == dtype and out.shape == ref.shape and out.is_contiguous()
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    else:   # an occasional 1-ulp flip where a value sits on a bf16 rounding boundary
        torch.testing.assert_close(out.float(), ref.float(), rtol=1e-2, atol=1e-5)


def _check(x, y, alpha, w, b, w2=None, b2=None):
    s, u, u2 = add_layer_norm(x, y, alpha, w, b, EPS, w2, b2)
    s_ref, u_ref, u2_ref = add_layer_norm_ref(x, y, alpha, w, b, EPS, w2, b2)
    assert s.dtype == x.dtype and s.is_contiguous()
    assert torch.equal(s, s_ref), "the sum is torch.add's, bit for bit"
    _assert_close(u, u_ref, x.dtype)
    if w2 is None:
        assert u2 is None
    else:
        _assert_close(u2, u2_ref, x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [40, 1000, 1024])
@pytest.mark.parametrize("alpha", [0.5, 1.0])
@pytest.mark.parametrize("bias,second", [(True, False), (False, False), (True, True), (False, True)])
def test_add_layer_norm_matches_ref(dtype, n, alpha, bias, second):
    g = torch.Generator().manual_seed(n + int(4 * alpha) + 2 * bias + second)
    x = (3.0 * torch.randn(7, n, generator=g) + 0.5).to(dtype).to(DEV)
    y = torch.randn(7, n, generator=g).to(dtype).to(DEV)
    w, b = _params(n, dtype, g, bias)
    w2, b2 = _params(n, dtype, g, bias) if second else (None, None)
    _check(x, y, alpha, w, b, w2, b2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_layer_norm_model_layout(dtype):
    # The first layer's x is the subsampler's last kept frame: [B·F, T', D][:, -1] unflattened
    # to [B, F, D], rows at stride T'·D; y a matmul's contiguous [B, F, D]. Also both strided.
    g = torch.Generator().manual_seed(9)
    B, n_f, T, D = 3, 2, 3, 1000
    sub = (2.0 * torch.randn(B * n_f, T, D, generator=g)).to(dtype).to(DEV)
    x = sub[:, -1].unflatten(0, (B, n_f))
    y = torch.randn(B, n_f, D, generator=g).to(dtype).to(DEV)
    w, b = _params(D, dtype, g)
    _check(x, y, 0.5, w, b, *_params(D, dtype, g))
    _check(x, sub[:, 0].unflatten(0, (B, n_f)), 1.0, w, b)
    s, u, _ = add_layer_norm(x, y, 1.0, w, b, EPS)
    assert s.shape == u.shape == (B, n_f, D)


def test_add_layer_norm_rejects_bad_args():
    x, y = torch.randn(4, 40, device=DEV), torch.randn(4, 40, device=DEV)
    w = torch.ones(40, device=DEV)
    with pytest.raises(AssertionError, match="y"):
        add_layer_norm(x, y.to(torch.bfloat16), 1.0, w, None, EPS)
    with pytest.raises(AssertionError, match="y"):
        add_layer_norm(x, y[:3], 1.0, w, None, EPS)
    with pytest.raises(AssertionError, match="weight"):
        add_layer_norm(x, y, 1.0, w[:39], None, EPS)
    with pytest.raises(AssertionError, match="bias2"):
        add_layer_norm(x, y, 1.0, w, None, EPS, None, w)
    with pytest.raises(AssertionError, match="collapse"):
        add_layer_norm(torch.randn(4, 6, 40, device=DEV)[:, :3], y[:3].expand(4, 3, 40).contiguous(),
                       1.0, w, None, EPS)


def test_add_layer_norm_empty_rows():
    x = torch.empty(0, 2, 40, device=DEV)
    s, u, u2 = add_layer_norm(x, x, 0.5, torch.ones(40, device=DEV), None, EPS)
    assert s.shape == u.shape == (0, 2, 40) and u2 is None


def _model(seed, dtype, use_bias):
    """Tiny perception with nonzero pos_bias_u/v, LayerNorm affines and (use_bias) linear biases:
    init_random leaves them 1 and 0, which would hide a swapped or dropped term."""
    cfg = dataclasses.replace(PW.PerceptionConfig.tiny(), use_bias=use_bias)
    g = torch.Generator().manual_seed(seed)
    sd = PW.init_random(cfg, g)
    for name, t in sd.items():
        if "pos_bias" in name or name.endswith("bias"):
            sd[name] = 0.3 * torch.randn(t.shape, generator=g)
        elif t.dim() == 1:                                          # LayerNorm weights
            sd[name] = 1.0 + 0.3 * torch.randn(t.shape, generator=g)
    model = P.Perception(cfg, device=DEV, dtype=dtype)
    model.load_named({k: t.to(DEV) for k, t in sd.items()})
    return model


class _Counted(TritonDecodeOps):
    """The engine's hooks, counting the fused add+LayerNorm calls (and those with a second norm)."""

    def __init__(self):
        self.add_norm = self.double = 0

    def perception_add_norm(self, x, y, alpha, norm, norm2=None):
        self.add_norm += 1
        self.double += norm2 is not None
        return super().perception_add_norm(x, y, alpha, norm, norm2)


# bf16: the reference rounds every product to bf16, the attention kernel none
@pytest.mark.parametrize("dtype,use_bias,tol", [(torch.float32, False, 1e-5), (torch.float32, True, 1e-5),
                                                (torch.bfloat16, False, 2e-2)])
@pytest.mark.slow
def test_perception_with_engine_hooks_equals_reference_path(dtype, use_bias, tol):
    model = _model(seed=3, dtype=dtype, use_bias=use_bias)
    ops = _Counted()
    with exact_fp32():
        enc, st = stream(model, None, CHUNKS)
        enc_fast, st_fast = stream(model, ops, CHUNKS)
        enc_again, _ = stream(model, None, CHUNKS)
    steps, layers = len(CHUNKS) + 2, model.cfg.n_layers
    assert ops.add_norm == 4 * layers * steps and ops.double == (layers - 1) * steps
    assert torch.equal(enc_again, enc), "uninstalled, the reference path is the one it was"
    assert rel(enc_fast, enc) < tol, rel(enc_fast, enc)
    for name in ("k", "v", "time"):
        assert rel(getattr(st_fast, name), getattr(st, name)) < tol, name
    assert torch.equal(st_fast.frames, st.frames)
