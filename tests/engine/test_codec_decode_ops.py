"""The codec's engine path (decode_ops.codec_step: channels-last, Upsample as one matmul, ConvNeXt
blocks through the convnext_step kernels reading and writing the [S, C, 6] caches in place;
kernels interpreted on the CPU) against the reference `Codec.step` on the tiny codec: the same pcm
and the same cache updates over consecutive frames at scattered slots, other slots untouched.
Also `install`: the hook set and cleared, and the Upsample matrix a view that follows a reload."""
import copy

import pytest
import torch

from gpu.engine.decode_ops import TritonDecodeOps, install, upsample_matrix
from gpu.model.codec import (PREFIX, Codec, CodecConfig, CodecState, Upsample, init_random,
                             load_codec)
from gpu.model.config import Profile, VoiceChatConfig
from gpu.model.voicechat import VoiceChat
from tests.tensorkit import counting, exact_fp32, rel

DEV = "cuda" if torch.cuda.is_available() else "cpu"      # compiled kernels need device tensors
CFG = CodecConfig.tiny()
SLOTS = 7


def weights(seed: int) -> dict[str, torch.Tensor]:
    w = init_random(CFG, torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed + 1)
    for name in w:      # biases 0 and LayerNorms at identity would hide a misplaced one
        if name.endswith(".bias") or ".norm." in name:
            w[name] = w[name] + 0.3 * torch.randn(w[name].shape, generator=g)
    return {n: t.to(DEV) for n, t in w.items()}


def make_codec(seed: int = 0) -> Codec:
    with torch.device("meta"):
        c = Codec(CFG)
    load_codec(c, weights(seed))
    return c


def busy_state() -> CodecState:
    """Every slot mid-stream (non-zero caches), so an untouched slot is a visible one."""
    state = CodecState.alloc(CFG, SLOTS, DEV)
    g = torch.Generator().manual_seed(7)
    for t in state.conv + [state.spec]:
        t.copy_(torch.randn(t.shape, generator=g))
    return state


def codes(b: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG.codebook_size, (b, CFG.n_codebooks), generator=g).to(DEV)


def run(codec: Codec, state: CodecState, frames: list[list[int]], index: torch.dtype):
    return [codec.step(state, codes(len(s), seed=f), torch.tensor(s, dtype=index, device=DEV))
            for f, s in enumerate(frames)]


@pytest.fixture(autouse=True)
def fp32_only():
    with exact_fp32():
        yield


@pytest.fixture(scope="module")
def codec():
    return make_codec()


@pytest.mark.slow
def test_engine_codec_step_equals_reference(codec):
    # Unsorted scattered slots; slot 0 runs a frame ahead. Each interpreted slot-frame costs
    # seconds on the CPU, so the fixture is as small as keeps every check.
    frames = [[5, 0], [0], [5, 0]]
    before = busy_state()
    st_ref, st_fast = copy.deepcopy(before), copy.deepcopy(before)
    ref = run(codec, st_ref, frames, torch.int64)            # the engine's slots: int64
    ops = counting(TritonDecodeOps(), "codec_step")
    codec.decode_ops = ops
    try:
        fast = run(codec, st_fast, frames, torch.int64)
    finally:
        codec.decode_ops = None
    assert ops.calls == len(frames)
    for a, b in zip(ref, fast):
        assert b.shape == a.shape and torch.isfinite(b).all()
        assert rel(b, a) < 1e-5, rel(b, a)
    untouched = [s for s in range(SLOTS) if s not in frames[0]]
    for got, want, old in zip(st_fast.conv, st_ref.conv, before.conv):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(got[untouched], old[untouched])
    # Spectra reach the magnitude cap (100), where fp32 rounding of the phase alone is ~1e-5:
    # atol 1e-4 is 1e-6 of the scale (the fp32 reference itself is 3e-5 off an fp64 run here).
    assert rel(st_fast.spec, st_ref.spec) < 1e-5
    torch.testing.assert_close(st_fast.spec, st_ref.spec, rtol=1e-5, atol=1e-4)
    assert torch.equal(st_fast.spec[untouched], before.spec[untouched])


def test_install_sets_and_clears_the_codec_hook():
    model = VoiceChat.random(VoiceChatConfig.tiny(), Profile.named("fp32"), DEV, seed=3)
    ops = counting(TritonDecodeOps(), "codec_step")
    install(model, ops)
    assert model.codec.decode_ops is ops
    for layer in model.codec.decoder.layers:
        if isinstance(layer, Upsample):        # made at install: the first frame may be a capture
            assert layer.weight.data_ptr() == layer.matrix.data_ptr()
    install(model, None)
    assert model.codec.decode_ops is None
    state = CodecState.alloc(CFG, 2, DEV)
    model.codec.step(state, codes(1, seed=0), torch.tensor([1], device=DEV))
    assert ops.calls == 0 and state.spec[1].any()


def matrix_of(w: torch.Tensor) -> torch.Tensor:
    """W' [C_in, k·C_out] as upsample_matrix's docstring defines it, from the ConvT weight."""
    return w.permute(0, 2, 1).reshape(w.shape[0], -1)


@pytest.mark.slow
def test_upsample_matrix_is_a_view_and_follows_a_reload():
    codec = make_codec(seed=0)
    keys = set(codec.state_dict())
    ups = [layer for layer in codec.decoder.layers if isinstance(layer, Upsample)]
    w0 = [up.weight.clone() for up in ups]
    mats = [upsample_matrix(up) for up in ups]
    for up, w, mat in zip(ups, w0, mats):
        assert torch.equal(up.weight, w) and torch.equal(mat, matrix_of(w))
        assert up.weight.data_ptr() == mat.data_ptr()     # a view: no second copy
        assert upsample_matrix(up) is mat                 # kept, not rebuilt per frame
    assert set(codec.state_dict()) == keys                # the buffer is not a checkpoint name

    load_codec(codec, weights(seed=5))                    # assigns new tensors: views broken
    remade = [upsample_matrix(up) for up in ups]
    for up, old, new in zip(ups, mats, remade):
        assert new is not old and torch.equal(new, matrix_of(up.weight))
    frames = [[4, 2]]
    state, st_ref = busy_state(), busy_state()
    codec.decode_ops = TritonDecodeOps()
    fast = run(codec, state, frames, torch.int32)          # int32 slots go in as they are too
    want = run(make_codec(seed=5), st_ref, frames, torch.int32)
    for a, b in zip(want, fast):
        assert rel(b, a) < 1e-5, rel(b, a)

    up = ups[0]                                           # an in-place load writes through
    with torch.no_grad():
        up.weight.copy_(weights(seed=9)[f"{PREFIX}decoder.layers.0.weight"])
    assert upsample_matrix(up) is remade[0] and torch.equal(remade[0], matrix_of(up.weight))
