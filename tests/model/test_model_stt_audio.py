"""Mel front end and perception: streamed frame by frame == the plain computation over the whole
utterance, on the tiny configs, fp32, fresh random inputs; batch invariance and reset."""
import dataclasses

import pytest
import torch

from gpu.model import mel as M
from gpu.model import perception as P
from gpu.model import perception_weights as PW
from tests.tensorkit import _no_grad, rel  # noqa: F401 (the fixture registers by import)

SAMPLES = 1280




def mel_model(pad_mode="constant"):
    cfg = M.MelConfig(n_mels=32, pad_mode=pad_mode)
    m = M.MelFrontEnd(cfg)
    m.load_named(M.init_random(cfg))
    return m


def perception_model(seed=0, sub_bias=0.0, cfg=None):
    """Tiny perception with every norm, bias and pos_bias perturbed away from 1/0 so the test sees
    them; subsampling biases scaled by `sub_bias` (0 = docs/MODEL.md §8's zeros)."""
    cfg = cfg or PW.PerceptionConfig.tiny()
    g = torch.Generator().manual_seed(seed)
    sd = PW.init_random(cfg, g)
    for k, v in sd.items():
        if "pre_encode.conv" in k and k.endswith("bias"):
            sd[k] = sub_bias * torch.randn(v.shape, generator=g)
        elif k.endswith("bias") or "pos_bias" in k:
            sd[k] = 0.3 * torch.randn(v.shape, generator=g)
        elif v.dim() == 1:                                  # norm weights
            sd[k] = 1.0 + 0.3 * torch.randn(v.shape, generator=g)
    model = P.Perception(cfg)
    model.load_named(sd)
    return model


def windows_from_columns(cols, cfg):
    """The 17-column window of every frame k: columns 8k−16 … 8k, zeros before column 0."""
    B, N, Mb = cols.shape
    K = (N - 1) // cfg.new_cols + 1
    padded = torch.cat([cols.new_zeros(B, cfg.window_cols - 1, Mb), cols], dim=1)
    return [padded[:, 8 * k: 8 * k + cfg.window_cols] for k in range(K)]


@pytest.mark.parametrize("pad_mode", ["constant", "reflect"])
def test_mel_streamed_equals_utterance(pad_mode):
    m, K, B = mel_model(pad_mode), 7, 3
    g = torch.Generator().manual_seed(1)
    audio = 0.3 * torch.randn(B, K * SAMPLES, generator=g)
    state = M.MelState.alloc(m.cfg, 5)
    slots = torch.tensor([4, 0, 2])
    outs = [m.step(state, audio[:, k * SAMPLES:(k + 1) * SAMPLES], slots) for k in range(K)]
    offline = m.forward_utterance(audio)                          # [B, 8K + 1, 32]
    streamed = torch.cat([o.new for o in outs], dim=1)            # columns −7 … 8K − 8
    assert streamed[:, :7].abs().max() == 0                       # columns before 0 are zeros
    assert rel(streamed[:, 7:], offline[:, :8 * K - 7]) < 1e-5
    torch.testing.assert_close(streamed[:, 7:], offline[:, :8 * K - 7], rtol=1e-5, atol=1e-5)
    # each window is the 9 previous + 8 new columns that perception's chunking asks for
    for k, (o, w) in enumerate(zip(outs, windows_from_columns(offline[:, :8 * K - 7], PW.PerceptionConfig.tiny()))):
        torch.testing.assert_close(o.window, w, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(offline).all() and offline.std() > 0.5


def test_mel_batch_invariance_and_reset():
    m = mel_model()
    g = torch.Generator().manual_seed(2)
    a, other = torch.randn(4 * SAMPLES, generator=g), torch.randn(3, 4 * SAMPLES, generator=g)
    alone = M.MelState.alloc(m.cfg, 4)
    ref = [m.step(alone, a[None, k * SAMPLES:(k + 1) * SAMPLES], torch.tensor([1])).window for k in range(4)]
    mixed = M.MelState.alloc(m.cfg, 4)
    m.step(mixed, other[:2, :SAMPLES], torch.tensor([0, 3]))      # others are one frame ahead
    for k in range(4):
        if k == 2:
            mixed.reset(torch.tensor([0]))
        chunk = torch.stack([other[0, k * SAMPLES:(k + 1) * SAMPLES], a[k * SAMPLES:(k + 1) * SAMPLES],
                             other[2, k * SAMPLES:(k + 1) * SAMPLES]])
        out = m.step(mixed, chunk, torch.tensor([3, 1, 0])).window
        torch.testing.assert_close(out[1], ref[k][0], rtol=1e-6, atol=1e-6)
    mixed.reset(torch.tensor([1]))                                # a reset slot is a fresh one
    again = [m.step(mixed, a[None, k * SAMPLES:(k + 1) * SAMPLES], torch.tensor([1])).window for k in range(4)]
    for x, y in zip(again, ref):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_mel_filterbank_and_window_are_real():
    fb = M.init_random(M.MelConfig.full())[M.PREFIX + "fb"][0]   # [128, 257]
    peaks = fb.argmax(1)
    assert (fb >= 0).all() and (peaks[1:] >= peaks[:-1]).all() and peaks[-1] > 200
    assert ((fb > 0).sum(1) >= 1).all()
    w = M.init_random(M.MelConfig.full())[M.PREFIX + "window"]
    assert w.shape == (400,) and w[0] == 0 and w[-1] == 0 and abs(w[199] - 1) < 1e-4


def test_pre_encode_first_frame_is_nemo_one_column_step():
    model = perception_model(sub_bias=0.5)
    cfg = model.cfg
    g = torch.Generator().manual_seed(3)
    col0 = torch.randn(2, 1, cfg.mel_bins, generator=g)
    window = torch.cat([torch.zeros(2, cfg.window_cols - 1, cfg.mel_bins), col0], dim=1)
    streamed = model.encoder.pre_encode(window, first=torch.tensor([True, True]))[:, -1]
    one_col = model.encoder.pre_encode(col0)                      # NeMo's first chunk: 1 column → 1 frame
    assert one_col.shape[1] == 1
    torch.testing.assert_close(streamed, one_col[:, 0], rtol=1e-5, atol=1e-6)
    unmasked = model.encoder.pre_encode(window, first=torch.tensor([False, False]))[:, -1]
    assert rel(unmasked, streamed) > 1e-3                         # the mask is doing something


@pytest.mark.parametrize("sub_bias", [0.0, 0.5])
def test_pre_encode_streamed_equals_offline_conv_stack(sub_bias):
    """NeMo's streaming feeds encoder frame 1 zero mel columns where offline has padding: equal
    everywhere when the subsampling biases are 0 (§8), and everywhere but frame 1 otherwise."""
    model = perception_model(sub_bias=sub_bias)
    cfg, K = model.cfg, 6
    g = torch.Generator().manual_seed(4)
    cols = torch.randn(2, 8 * (K - 1) + 1, cfg.mel_bins, generator=g)
    offline = model.encoder.pre_encode(cols)                      # [2, K, D]
    assert offline.shape[1] == K
    for k, w in enumerate(windows_from_columns(cols, cfg)):
        x = model.encoder.pre_encode(w, first=torch.full((2,), k == 0))[:, -1]
        if sub_bias and k == 1:
            assert rel(x, offline[:, k]) > 1e-3
        else:
            torch.testing.assert_close(x, offline[:, k], rtol=1e-5, atol=1e-5)


def run_stream(model, windows, state, slots):
    outs = [model.step(state, w, slots) for w in windows]
    return torch.stack([o.enc for o in outs], 1), torch.stack([o.audio for o in outs], 1)


def test_conformer_streamed_equals_masked_full_utterance():
    """12 frames with a 5-frame left context: the channel cache evicts rows from frame 6 on."""
    model = perception_model(seed=5)
    cfg, K = model.cfg, 12
    g = torch.Generator().manual_seed(6)
    cols = torch.randn(3, 8 * (K - 1) + 1, cfg.mel_bins, generator=g)
    state = P.PerceptionState.alloc(cfg, 4)
    enc, audio = run_stream(model, windows_from_columns(cols, cfg), state, torch.tensor([2, 0, 3]))
    off = model.forward_utterance(cols)
    assert off.enc.shape == (3, K, cfg.d_model) and off.audio.shape == (3, K, cfg.out_dim)
    assert rel(enc, off.enc) < 1e-5 and rel(audio, off.audio) < 1e-5
    torch.testing.assert_close(enc, off.enc, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(audio, off.audio, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(enc).all() and torch.isfinite(audio).all()
    # a context of 5 is really used: with a longer context the late frames change
    wide = perception_model(seed=5, cfg=dataclasses.replace(cfg, left_context=20))
    assert rel(wide.forward_utterance(cols).enc[:, 7:], off.enc[:, 7:]) > 1e-3


@pytest.mark.parametrize("split", [(2, 2, 2, 2, 2, 2), (1, 2, 2, 1, 2, 2, 2), (2, 1, 1, 2, 2, 2, 1, 1)])
def test_conformer_chunked_steps_equal_single_frames_and_offline(split):
    """Frames taken in chunks of up to chunk_frames (the beat's two) per step, starting on odd
    and even frames, over 12 frames with a 5-frame context (the ring wraps and evicts): the
    same outputs and the same state as one frame a step, and as the offline utterance."""
    model = perception_model(seed=12)
    cfg, K = model.cfg, sum(split)
    g = torch.Generator().manual_seed(13)
    cols = torch.randn(3, 8 * (K - 1) + 1, cfg.mel_bins, generator=g)
    windows, slots = windows_from_columns(cols, cfg), torch.tensor([3, 0, 1])
    single = P.PerceptionState.alloc(cfg, 4)
    enc1, audio1 = run_stream(model, windows, single, slots)
    chunked, encs, auds, k = P.PerceptionState.alloc(cfg, 4), [], [], 0
    for n in split:
        out = model.step_frames(chunked, torch.stack(windows[k:k + n], 1), slots)
        assert out.enc.shape == (3, n, cfg.d_model)
        encs.append(out.enc)
        auds.append(out.audio)
        k += n
    enc, audio = torch.cat(encs, 1), torch.cat(auds, 1)
    torch.testing.assert_close(enc, enc1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(audio, audio1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(enc, model.forward_utterance(cols).enc, rtol=1e-5, atol=1e-5)
    for name in ("k", "v", "time", "frames"):
        torch.testing.assert_close(getattr(chunked, name), getattr(single, name), rtol=1e-5, atol=1e-5)


def test_conformer_step_refuses_more_frames_than_its_ring_holds():
    model = perception_model()
    cfg = model.cfg
    state = P.PerceptionState.alloc(cfg, 2)
    windows = torch.zeros(1, cfg.chunk_frames + 1, cfg.window_cols, cfg.mel_bins)
    with pytest.raises(ValueError, match="chunks of 2"):
        model.step_frames(state, windows, torch.tensor([0]))
    assert int(state.frames[0]) == 0


def test_mel_to_perception_chain_matches_offline():
    m, model, K = mel_model(), perception_model(seed=7), 5
    g = torch.Generator().manual_seed(8)
    audio = 0.3 * torch.randn(2, K * SAMPLES, generator=g)
    ms, ps, slots = M.MelState.alloc(m.cfg, 2), P.PerceptionState.alloc(model.cfg, 2), torch.tensor([1, 0])
    windows = [m.step(ms, audio[:, k * SAMPLES:(k + 1) * SAMPLES], slots).window for k in range(K)]
    enc, _ = run_stream(model, windows, ps, slots)
    off = model.forward_utterance(m.forward_utterance(audio)[:, :8 * K - 7])
    torch.testing.assert_close(enc, off.enc, rtol=1e-5, atol=1e-5)


def test_perception_batch_invariance_and_reset():
    model = perception_model(seed=9)
    cfg, K = model.cfg, 8
    g = torch.Generator().manual_seed(10)
    wa = windows_from_columns(torch.randn(1, 8 * (K - 1) + 1, cfg.mel_bins, generator=g), cfg)
    wo = windows_from_columns(torch.randn(2, 8 * (K + 2) + 1, cfg.mel_bins, generator=g), cfg)
    ref_enc, ref_audio = run_stream(model, wa, P.PerceptionState.alloc(cfg, 4), torch.tensor([1]))
    state = P.PerceptionState.alloc(cfg, 4)
    for k in range(3):                                            # slots 0 and 3 run ahead
        model.step(state, wo[k], torch.tensor([0, 3]))
    encs = []
    for k in range(K):
        if k == 4:
            state.reset(torch.tensor([3]))
        w = torch.cat([wo[k + 3][:1], wa[k], wo[k + 3][1:]])
        encs.append(model.step(state, w, torch.tensor([0, 1, 3])).enc[1])
    torch.testing.assert_close(torch.stack(encs), ref_enc[0], rtol=1e-5, atol=1e-5)
    state.reset(torch.tensor([1]))
    enc, audio = run_stream(model, wa, state, torch.tensor([1]))
    torch.testing.assert_close(enc, ref_enc, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(audio, ref_audio, rtol=1e-6, atol=1e-6)


def test_perception_bf16_profile_is_close_and_finite():
    model = perception_model(seed=11)
    cfg, K = model.cfg, 6
    bf = P.Perception(cfg, dtype=torch.bfloat16)
    bf.load_named({PW.PREFIX + k: v for k, v in model.state_dict().items()})
    g = torch.Generator().manual_seed(12)
    windows = windows_from_columns(torch.randn(2, 8 * (K - 1) + 1, cfg.mel_bins, generator=g), cfg)
    ref, _ = run_stream(model, windows, P.PerceptionState.alloc(cfg, 2), torch.arange(2))
    state = P.PerceptionState.alloc(cfg, 2, dtype=torch.bfloat16)
    enc, audio = run_stream(bf, windows, state, torch.arange(2))
    assert enc.dtype == torch.bfloat16 and state.k.dtype == state.v.dtype == torch.bfloat16
    assert torch.isfinite(enc).all() and torch.isfinite(audio).all()
    assert rel(enc.float(), ref) < 3e-2


def test_subsampling_receptive_field_is_causal_2_before_1_after():
    """Output (t, f) of the conv stack depends on exactly inputs [8t − 14, 8t] × [8f − 14, 8f]:
    NeMo's CausalConv2D pads 2 before and 1 after in both time and frequency at each stage."""
    cfg = dataclasses.replace(PW.PerceptionConfig.tiny(), sub_channels=8)
    model = perception_model(seed=13, cfg=cfg)
    for conv in model.encoder.pre_encode.conv:
        if isinstance(conv, torch.nn.Conv2d):
            conv.bias.data.fill_(5.0)                             # keep every ReLU open
    g = torch.Generator().manual_seed(14)
    mel = torch.randn(1, 17, cfg.mel_bins, generator=g)
    base = model.encoder.pre_encode.conv_stack(mel)[0]           # [C, 3, sub_freq]
    for t_in, f_in in ((16, 0), (9, 31), (2, 17), (0, 14)):
        poked = mel.clone()
        poked[0, t_in, f_in] += 10.0
        changed = (model.encoder.pre_encode.conv_stack(poked)[0] - base).abs().amax(0) > 1e-6   # [3, F']
        t, f = torch.arange(changed.shape[0])[:, None], torch.arange(changed.shape[1])
        expect = (8 * t - 14 <= t_in) & (t_in <= 8 * t) & (8 * f - 14 <= f_in) & (f_in <= 8 * f)
        assert torch.equal(changed, expect), (t_in, f_in)
