"""The whole model (gpu/model/voicechat*.py, config.py) on the tiny config, fp32 profile: the frame
step, batch invariance, chunked session start, forced function tokens, noise, state sizes."""
import copy
import dataclasses

import pytest
import torch

from gpu.model.config import PROFILES, Profile, VoiceChatConfig
from wave_actors.core.text import BOS, EOS, PAD
from gpu.model.voicechat import VoiceChat
from gpu.model.voicechat_noise import FrameNoise
from gpu.model.voicechat_state import VoiceChatState, session_state_bytes
from tests.model.test_model_voicechat_kit import (CFG, FP32, NOISE_SEED, assert_rows_equal, audio, frame,
                                                  prompt, row, start)




@pytest.fixture(scope="module")
def model(one_thread) -> VoiceChat:
    return VoiceChat.random(CFG, FP32, seed=0)


def new_state(model, slots=4, context=16, prompt_positions=64) -> VoiceChatState:
    return model.alloc_state(slots, context, prompt_positions)


# ------------------------------------------------------------------------------------ the step

def test_frame_step_is_finite_and_in_range(model):
    state = new_state(model)
    slots = [3, 0, 1]
    start(model, state, slots, [prompt(1, 5), prompt(2, 9), prompt(3, 1)], chunk=4, warm=3)
    assert state.talker.position[slots].tolist() == [CFG.talker.n_warmup] * 3
    assert state.thinker.length[slots].tolist() == [7, 11, 3]
    for t in range(4):
        o = frame(model, state, slots, [1, 2, 3], t)
        assert o.pcm.shape == (3, 1764) and o.pcm.dtype == torch.float32
        assert torch.isfinite(o.pcm).all() and o.pcm.abs().max() > 0
        assert o.text.shape == o.func.shape == (3,) and o.user.shape == (3, CFG.rnnt.max_symbols)
        assert ((0 <= o.text) & (o.text < CFG.thinker.vocab)).all()
        assert ((0 <= o.func) & (o.func < CFG.thinker.vocab)).all()
        assert ((-1 <= o.user) & (o.user < CFG.rnnt.vocab)).all()
        assert o.codes.shape == (3, CFG.talker.n_codebooks)
        assert ((0 <= o.codes) & (o.codes < CFG.codec.codebook_size)).all()
        assert o.bou.shape == o.eou.shape == (3,)
    assert torch.equal(state.text_prev[slots], o.text) and torch.equal(state.func_prev[slots], o.func)
    assert state.talker.position[slots].tolist() == [CFG.talker.n_warmup + 4] * 3
    assert state.mel.frames[slots].tolist() == state.perception.frames[slots].tolist() == [4] * 3


def test_a_session_is_the_same_alone_and_in_a_changing_batch(model):
    """Slot 2 runs session 7 alone, then with other sessions in a permuted batch while slot 0 is
    reset and restarted and slot 3 starts (prefill + warm-up) between its frames."""
    alone = new_state(model)
    start(model, alone, [2], [prompt(7, 11)], chunk=5, warm=3)
    ref = [row(frame(model, alone, [2], [7], t), 0) for t in range(8)]

    crowd = new_state(model)
    start(model, crowd, [2, 0], [prompt(7, 11), prompt(3, 4)], chunk=5, warm=3)
    got = []
    t0 = t3 = 0                                    # frames run by the sessions in slots 0 and 3
    for t in range(8):
        if t == 2:
            start(model, crowd, [3], [prompt(8, 20)], chunk=5, warm=3)
        if t == 3:
            start(model, crowd, [0], [prompt(9, 6)], chunk=5, warm=3)  # a new session in slot 0
            t0 = 0
        slots, sessions, ts = [2], [7], [t]
        if t != 3:
            slots, sessions, ts = [0] + slots, [3 if t < 3 else 9] + sessions, [t0] + ts
            t0 += 1
        if t >= 3:
            slots, sessions, ts = slots + [3], sessions + [8], ts + [t3]
            t3 += 1
        o = frame(model, crowd, slots, sessions, ts)
        got.append(row(o, slots.index(2)))
    for a, b in zip(ref, got):
        assert_rows_equal(a, b)


def test_chunked_session_start_equals_one_go(model):
    """The system prompt in chunks of 6 (batched with a shorter ragged prompt) and the warm-up in
    chunks of 3 give the same session as one chunk each, through the whole pipeline."""
    p = prompt(21, 38)
    one = new_state(model)
    start(model, one, [1], [p], chunk=len(p))
    chunked = new_state(model)
    start(model, chunked, [1, 0], [p, prompt(22, 11)], chunk=6, warm=3)
    th1, th2 = one.thinker, chunked.thinker
    assert th1.length[1] == th2.length[1] == len(p)
    assert torch.allclose(th1.ssm[:, 1], th2.ssm[:, 1], atol=1e-5)
    assert torch.allclose(th1.k[:, 1, :len(p)], th2.k[:, 1, :len(p)], atol=1e-5)
    assert torch.allclose(one.talker.k[1], chunked.talker.k[1], atol=1e-5)
    for t in range(6):
        assert_rows_equal(row(frame(model, one, [1], [4], t), 0),
                          row(frame(model, chunked, [1], [4], t), 0))


def test_forced_function_token_replaces_f_and_pads_the_text(model):
    state = new_state(model)
    start(model, state, [0, 1], [prompt(31, 6), prompt(32, 8)])
    for t in range(2):
        frame(model, state, [0, 1], [5, 6], t)
    forced_id = 1000 + ord("<")
    assert state.text_prev[0] != PAD and state.func_prev[0] != forced_id      # the test can fail
    forced, by_hand, free = (copy.deepcopy(state) for _ in range(3))
    o_forced = frame(model, forced, [0, 1], [5, 6], 2, forced=[forced_id, -1])
    by_hand.text_prev[0], by_hand.func_prev[0] = PAD, forced_id
    o_hand = frame(model, by_hand, [0, 1], [5, 6], 2)
    o_free = frame(model, free, [0, 1], [5, 6], 2)
    for b in (0, 1):
        assert_rows_equal(row(o_forced, b), row(o_hand, b), atol=0)
    assert_rows_equal(row(o_forced, 1), row(o_free, 1), atol=0)            # slot 1 not forced
    assert not torch.equal(forced.thinker.ssm[:, 0], free.thinker.ssm[:, 0])
    assert torch.equal(forced.thinker.ssm[:, 1], free.thinker.ssm[:, 1])
    assert forced.func_prev[0] == o_forced.func[0]      # the model's own f_t feeds the next frame
    assert_rows_equal(row(frame(model, forced, [0], [5], 3), 0), row(frame(model, by_hand, [0], [5], 3), 0),
                      atol=0)


def test_turns_drive_idle_silence(model, monkeypatch):
    """Scripted thinker tokens: a turn runs from BOS to EOS; PAD outside a turn sends silence codes
    to the codec, PAD inside one does not; EOS feeds silence back to the talker (docs/MODEL.md §2.5)."""
    script = iter([PAD, BOS, 1100, PAD, EOS, PAD])
    thinker_step, codec_step, sent = model.thinker.step, model.codec.step, []

    def scripted(*args, **kwargs):
        out = thinker_step(*args, **kwargs)
        out.text = torch.full_like(out.text, next(script))
        return out

    def recording(state, codes, slots):
        sent.append(codes.clone())
        return codec_step(state, codes, slots)
    monkeypatch.setattr(model.thinker, "step", scripted)
    monkeypatch.setattr(model.codec, "step", recording)
    state = new_state(model)
    start(model, state, [1], [prompt(71, 4)])
    silence = model.talker.codec_silence_tokens.long()
    speaking = []
    for t in range(6):
        o = frame(model, state, [1], [3], t)
        speaking.append(bool(state.speaking[1]))
        assert torch.equal(sent[-1][0], silence) == (t in (0, 5)), t
        if t == 4:
            assert torch.equal(state.talker.prev_codes[1], silence) and not torch.equal(o.codes[0], silence)
    assert speaking == [False, True, True, True, False, False]


# ----------------------------------------------------------------------------------- noise

def test_noise_is_a_function_of_seed_session_and_frame():
    tk = CFG.talker
    a = FrameNoise.for_talker(tk, 3, torch.tensor([5, 9, 5]), torch.tensor([0, 0, 1]))
    b = FrameNoise.for_talker(tk, 3, torch.tensor([9]), torch.tensor([0]))
    assert a.uniforms.shape == (3, tk.n_steps, tk.n_mixtures) and a.normals.shape == (3, tk.n_steps, tk.latent)
    assert torch.equal(a.uniforms[1], b.uniforms[0]) and torch.equal(a.normals[1], b.normals[0])
    assert not torch.equal(a.uniforms[0], a.uniforms[2]) and not torch.equal(a.uniforms[0], a.uniforms[1])
    c = FrameNoise.for_talker(tk, 4, torch.tensor([5]), torch.tensor([0]))
    assert not torch.equal(a.uniforms[0], c.uniforms[0])
    big = FrameNoise.draw(0, torch.arange(64), torch.zeros(64, dtype=torch.long), 8, 1024, 512)
    u, n = big.uniforms, big.normals
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01 and abs(u.std() - 12 ** -0.5) < 0.01
    assert torch.isfinite(n).all() and abs(n.mean()) < 0.02 and abs(n.std() - 1) < 0.02
    assert len(torch.unique(u)) > 0.97 * u.numel()


# --------------------------------------------------------------------------- configs, state

@pytest.mark.parametrize("name", ["full", "tiny"])
def test_configs_fit_together(name):
    cfg = VoiceChatConfig.named(name)
    assert cfg.perception.out_dim == cfg.thinker.hidden and cfg.talker.text_vocab == cfg.thinker.vocab
    assert cfg.codec.n_codebooks == cfg.talker.n_codebooks and cfg.rnnt.enc_dim == cfg.perception.d_model
    with pytest.raises(ValueError, match="thinker.hidden"):
        VoiceChatConfig("bad", cfg.mel, dataclasses.replace(cfg.perception, out_dim=cfg.thinker.hidden + 1),
                        cfg.rnnt, cfg.thinker, cfg.talker, cfg.codec)
    assert cfg.with_max_chars(40).talker.max_chars == 40 and cfg.talker.max_chars != 40


def test_the_ssm16_profile_is_dense_with_half_the_ssm_state_bytes():
    cfg, dense, ssm16 = VoiceChatConfig.full(), Profile.named("dense"), Profile.named("dense-ssm16")
    assert ssm16.ssm == torch.bfloat16 and (ssm16.compute, ssm16.talker_kv, ssm16.cfg_rows) == \
        (dense.compute, dense.talker_kv, dense.cfg_rows)
    a, b = session_state_bytes(cfg, dense, 1500), session_state_bytes(cfg, ssm16, 1500)
    assert b["thinker.ssm"] * 2 == a["thinker.ssm"] == 141_557_760
    assert a["total"] - b["total"] == 141_557_760 // 2
    state = VoiceChatState.alloc(CFG, ssm16, 2, 4)
    assert state.thinker.ssm.dtype == torch.bfloat16 and state.thinker.k.dtype == torch.bfloat16


def test_stochastic_rounding_is_an_option_on_a_bf16_ssm_state_only():
    ssm16, sr = Profile.named("dense-ssm16"), Profile.named("dense-ssm16-sr")
    assert (sr.ssm, sr.ssm_round, ssm16.ssm_round) == (torch.bfloat16, "stochastic", "nearest")
    assert session_state_bytes(CFG, sr, 64) == session_state_bytes(CFG, ssm16, 64)
    assert VoiceChatState.alloc(CFG, sr, 2, 4).thinker.ssm_round == "stochastic"
    with pytest.raises(ValueError, match="ssm_round"):
        dataclasses.replace(Profile.named("dense"), ssm_round="stochastic")    # fp32 state
    with pytest.raises(ValueError, match="ssm_round"):
        dataclasses.replace(ssm16, ssm_round="dither")


def test_the_compact_profile_holds_the_talker_kv_in_a_byte_an_element():
    cfg = VoiceChatConfig.full()
    ssm16, compact = Profile.named("dense-ssm16"), Profile.named("dense-compact")
    a, b = session_state_bytes(cfg, ssm16, 1500), session_state_bytes(cfg, compact, 1500)
    for part in ("talker.k", "talker.v"):
        assert b[part] * 2 == a[part]
    assert a["total"] - b["total"] == (a["talker.k"] + a["talker.v"]) // 2
    assert "talker.kv_scale" not in b                        # one per model, not per session
    state = VoiceChatState.alloc(CFG, compact, 2, 4)
    assert state.talker.kv8 and state.talker.kv_scale.shape == (CFG.talker.n_layers, 2,
                                                                 CFG.talker.n_kv_heads)


def test_profiles_follow_model_md_section_4():
    ref, dense = Profile.named("reference"), Profile.named("dense")
    assert ref.compute == dense.compute == torch.bfloat16 and ref.ssm == torch.float32
    assert (ref.talker_kv, ref.cfg_rows) == (torch.float32, 2)
    assert (dense.talker_kv, dense.cfg_rows) == (torch.bfloat16, 1)
    assert PROFILES["fp32"].compute == torch.float32
    with pytest.raises(ValueError, match="unknown profile"):
        Profile.named("fast")


KV_RING_EXTRA = 24 * 72 * 2 * 1024 * 2 - 3_440_640    # perception K/V ring vs §3's channel cache


@pytest.mark.parametrize("name,mb,fixed,growth", [("reference", 969.6, 166_694_864, 532_480),
                                                   ("dense", 374.3, 152_373_200, 145_408)])
def test_session_state_bytes_match_model_md_section_3(name, mb, fixed, growth):
    """From the allocated shapes on the meta device. The differences from §3's table: the
    perception caches K and V in a 72-row ring (§2.2's exact alternative, with a row for the
    beat's second frame: 7,077,888 B instead of the 3,440,640 B channel cache), the thinker's trash KV row (16,384 B), int64 counters and
    tokens, the mel tail (−116 B) and no 8-sample ISTFT tail (flush recomputes it). The talker
    holds an even number of positions (aligned_positions: 37 warm-up + 1500 frames take 1538)."""
    cfg, profile = VoiceChatConfig.full(), Profile.named(name)
    at = session_state_bytes(cfg, profile, 1501)                        # 1538 positions, no padding
    assert round(at["total"] / 1e6, 1) == mb
    padded = session_state_bytes(cfg, profile, 1500)
    assert padded["talker.k"] == at["talker.k"] and at["total"] - padded["total"] == 16_384
    assert session_state_bytes(cfg, profile, 1503)["total"] - at["total"] == 2 * growth
    base = session_state_bytes(cfg, profile, 1)                         # 38 positions
    assert 16_384 <= base["total"] - fixed - growth - KV_RING_EXTRA < 16_384 + 512
    assert base["thinker.ssm"] == 141_557_760 and base["thinker.conv"] == 1_990_656
    assert base["perception.k"] + base["perception.v"] == 7_077_888
    assert base["perception.time"] == 393_216
    assert base["talker.k"] + base["talker.v"] == {"reference": 19_095_552, "dense": 4_773_888}[name] + growth - 16_384
    assert sum(v for k, v in base.items() if k.startswith("codec.conv")) == 193_536
    assert session_state_bytes(cfg, profile, 1501, prompt=100)["total"] - at["total"] == 100 * 16_384


def test_reset_touches_only_its_slots(model):
    state = new_state(model)
    start(model, state, [0, 1], [prompt(41, 3), prompt(42, 3)])
    frame(model, state, [0, 1], [1, 2], 0)
    before = copy.deepcopy(state)
    state.reset(torch.tensor([1]))
    for name, t in state.tensors():
        if name.startswith("rnnt.start"):
            continue
        old = dict(before.tensors())[name]
        dim = 0 if t.shape[0] == state.max_slots else 1
        assert torch.equal(t.select(dim, 0), old.select(dim, 0)), name
    assert state.thinker.length[1] == 0 and state.talker.position[1] == 0
    assert state.text_prev[1] == PAD and not state.speaking[1]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["fp32", "reference", "dense"])
def test_cuda_graph_replay_equals_eager(name):
    """The frame step captures into one CUDA graph (no host syncs, static shapes) and its replays
    equal eager steps, a forced function token included."""
    dev = torch.device("cuda")
    model = VoiceChat.random(CFG, Profile.named(name), dev, seed=0)
    slots, sessions = [2, 0, 3], [1, 2, 3]
    eager, graphed, scratch = (model.alloc_state(4, 12, 32) for _ in range(3))
    for state in (eager, graphed, scratch):
        start(model, state, slots, [prompt(1, 5), prompt(2, 9), prompt(3, 1)])
    x = torch.zeros(3, 1280, device=dev)
    idx, keys = torch.tensor(slots, device=dev), torch.tensor(sessions, device=dev)
    t_buf, forced = torch.zeros(3, dtype=torch.long, device=dev), torch.full((3,), -1, device=dev)

    def body(state):
        return model.step(state, x, idx, model.noise(NOISE_SEED, keys, t_buf), forced)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):                                  # warm-up on a scratch state
            body(scratch)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = body(graphed)
    for t in range(6):
        force = [1000 + ord("<"), -1, -1] if t == 3 else [-1, -1, -1]
        x.copy_(torch.stack([audio(s, t) for s in sessions]))
        t_buf.fill_(t)
        forced.copy_(torch.tensor(force))
        graph.replay()
        ref = frame(model, eager, slots, sessions, t, forced=force)
        for b in range(3):
            assert_rows_equal(row(out, b), row(ref, b), atol=1e-6)
    assert torch.equal(graphed.thinker.ssm, eager.thinker.ssm) and torch.equal(graphed.talker.k, eager.talker.k)


def test_the_cli_profiles_are_the_models_serving_profiles():
    """Catches a profile added to the model but not offered by `--profile` (or offered and
    unknown): the CLIs name them without importing torch."""
    from wave_actors.core.registry import SERVING_PROFILES
    assert set(SERVING_PROFILES) == set(PROFILES) - {"fp32", "fp32-dense"}
