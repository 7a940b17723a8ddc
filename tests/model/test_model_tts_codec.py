"""Reference codec decoder (gpu/model/codec.py) on the tiny config: streaming == whole sequence."""
import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gpu.model.codec import (PREFIX, Codec, CodecConfig, CodecState, ConvNeXtBlock, init_random,
                             load_codec, param_shapes)

CFG = CodecConfig.tiny()
RTOL, ATOL = 1e-5, 1e-5




@pytest.fixture(scope="module")
def codec(one_thread) -> Codec:
    with torch.device("meta"):
        c = Codec(CFG)
    weights = init_random(CFG, torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    for name in weights:                      # LayerNorm at identity would hide a misplaced norm
        if ".norm." in name:
            weights[name] = weights[name] + 0.3 * torch.randn(weights[name].shape, generator=g)
    load_codec(c, weights)
    return c


def codes(b: int, t: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG.codebook_size, (b, t, CFG.n_codebooks), generator=g)


def stream(codec: Codec, seq: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    state, slots = CodecState.alloc(CFG, 3, dtype=dtype), torch.tensor([2, 0])
    frames = [codec.step(state, seq[:, t], slots) for t in range(seq.shape[1])]
    assert all(f.shape == (2, 1764) for f in frames)
    tail = codec.flush(state, slots)
    assert tail.shape == (2, 8)
    assert not state.spec[1].any() and not any(c[1].any() for c in state.conv)   # slot 1 untouched
    return torch.cat(frames + [tail], dim=-1)


def test_streamed_frames_equal_whole_sequence(codec):
    seq = codes(2, 4, seed=2)
    whole = codec.decode_sequence(seq)
    assert whole.shape == (2, 4 * 1764 + 8)
    assert torch.isfinite(whole).all() and whole.abs().max() > 0.1
    # fp32: atol 1e-4, not 1e-5. Spectra reach magnitude 100 and are clamped into samples ≤ 1,
    # and CPU conv kernels round differently for 1 frame than for 4 (measured 2e-5 here): ~1e-7
    # of the spectral scale. The fp64 run below shows the streaming itself is exact.
    torch.testing.assert_close(stream(codec, seq), whole, rtol=RTOL, atol=1e-4)
    codec64 = copy.deepcopy(codec).double()
    torch.testing.assert_close(stream(codec64, seq, torch.float64), codec64.decode_sequence(seq),
                               rtol=1e-10, atol=1e-10)


def test_full_config_frame_geometry():
    full = CodecConfig.full()
    assert (full.spectra_per_frame, full.samples_per_frame, full.cache_spectra, full.flush_spectra,
            full.istft_pad, full.stream_trim) == (441, 1764, 4, 2, 6, 8)
    assert full.block_channels == (1536,) * 3 + (768,) * 3 + (384,) * 3
    assert CFG.samples_per_frame == 1764 and CFG.rates == full.rates


def test_upsample_is_conv_transpose_with_kernel_equal_stride(codec):
    up = codec.decoder.layers[4]
    x = torch.randn(3, up.weight.shape[0], 5, generator=torch.Generator().manual_seed(3))
    ref = F.conv_transpose1d(x, up.weight, stride=up.weight.shape[2])
    torch.testing.assert_close(up(x), ref, rtol=RTOL, atol=ATOL)


def naive_istft(spec: np.ndarray) -> np.ndarray:
    """Loop-by-loop ISTFT of real|imag spectra [18, N] in float64 (docs/MODEL.md §2.6 step 5)."""
    nb, n = CFG.n_bins, spec.shape[1]
    w = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(CFG.n_fft) / CFG.n_fft)
    length = (n - 1) * CFG.hop + CFG.n_fft
    ola, env = np.zeros(length), np.zeros(length)
    for i in range(n):
        frame = np.fft.irfft(spec[:nb, i] + 1j * spec[nb:, i], n=CFG.n_fft)
        frame = np.clip(frame, -w, w) * w
        ola[i * CFG.hop:i * CFG.hop + CFG.n_fft] += frame
        env[i * CFG.hop:i * CFG.hop + CFG.n_fft] += w * w
    cut = slice(6 + 8, length - 6 - 8)           # the outer samples have a zero envelope
    return ola[cut] / env[cut]


def test_istft_matches_a_loop_reference(codec):
    g = torch.Generator().manual_seed(4)
    spec = torch.randn(2, 2 * CFG.n_bins, 20, generator=g) * 0.3
    spec[:, CFG.n_bins] = 0                      # imag of bins 0 and 8 is zero by construction
    spec[:, -1] = 0
    out = codec.istft(spec)
    for b in range(2):
        np.testing.assert_allclose(out[b].numpy(), naive_istft(spec[b].double().numpy()),
                                   rtol=RTOL, atol=ATOL)
    loud = codec.istft(spec * 100)               # large spectra are clamped into ±w[n]
    assert loud.abs().max() <= 1 + 1e-6


def test_spectra_magnitude_and_phase(codec):
    lat = torch.randn(1, CFG.latent, 1, generator=torch.Generator().manual_seed(5))
    ctx = [torch.zeros(1, c, CFG.cache_width) for c in CFG.block_channels]
    spec, _ = codec.spectra(lat, ctx)
    x = lat
    for layer in codec.decoder.layers[:-1]:
        x = layer(x, torch.zeros(1, x.shape[1], CFG.cache_width))[0] \
            if isinstance(layer, ConvNeXtBlock) else layer(x)
    p = codec.decoder.layers[-1](x)
    mag = 100 / (1 + torch.exp(-(p[:, :9] - math.log(100))))
    real, imag = mag * torch.cos(p[:, 9:]), mag * torch.sin(p[:, 9:])
    imag[:, [0, 8]] = 0
    # atol 1e-4 on values up to 100 (the magnitude cap): 1e-6 of the scale.
    torch.testing.assert_close(spec, torch.cat([real, imag], 1), rtol=RTOL, atol=1e-4)


def test_batch_invariance_and_reset_isolation(codec):
    seq = codes(3, 3, seed=6)
    alone, batch = CodecState.alloc(CFG, 4), CodecState.alloc(CFG, 4)
    for t in range(3):
        a = codec.step(alone, seq[1:2, t], torch.tensor([1]))
        b = codec.step(batch, seq[:, t], torch.tensor([3, 1, 0]))
        torch.testing.assert_close(b[1:2], a, rtol=RTOL, atol=ATOL)
        batch.reset(torch.tensor([3]))           # another slot restarting changes nothing for 1
    batch.reset(torch.tensor([1]))
    assert not batch.spec[1].any() and not any(c[1].any() for c in batch.conv)
    assert batch.spec[0].any() and all(c[0].any() for c in batch.conv)


@pytest.mark.parametrize("cfg", [CodecConfig.tiny(), CodecConfig.full()], ids=["tiny", "full"])
def test_param_shapes_are_the_module_names(cfg):
    with torch.device("meta"):
        c = Codec(cfg)
    module = {PREFIX + k: tuple(v.shape) for k, v in c.state_dict().items()}
    assert module == param_shapes(cfg)
    assert module[PREFIX + "decoder.layers.12.weight"] == (18, cfg.base_channels, 1)


def test_full_param_counts_match_model_md():
    shapes = param_shapes(CodecConfig.full())
    books = sum(math.prod(s) for n, s in shapes.items() if ".mus_list." in n)
    rest = sum(math.prod(s) for n, s in shapes.items() if ".mus_list." not in n)
    assert (round(rest / 1e6), round(books / 1e6), round((rest + books) / 1e6, 1)) == (92, 16, 108.1)
    assert shapes[PREFIX + "decoder.layers.4.weight"] == (1536, 768, 7)


def test_pointwise_convs_as_matmuls_equal_the_convs(codec):
    """The CUDA path (ConvNeXtBlock.matmul: 1×1 convs as row-major matmuls) is the same
    computation as the conv path, up to fp32 rounding; fp64 shows it exactly."""
    seq = codes(2, 2, seed=5)
    block = ConvNeXtBlock
    try:
        block.matmul = False
        convs = codec.decode_sequence(seq)
        codec64 = copy.deepcopy(codec).double()
        convs64 = codec64.decode_sequence(seq)
        block.matmul = True
        matmuls = codec.decode_sequence(seq)
        matmuls64 = codec64.decode_sequence(seq)
    finally:
        block.matmul = None
    torch.testing.assert_close(matmuls, convs, rtol=RTOL, atol=1e-4)
    torch.testing.assert_close(matmuls64, convs64, rtol=1e-12, atol=1e-12)
