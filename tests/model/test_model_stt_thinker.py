"""Thinker: Mamba2 step == its SSD whole-sequence form (states included); KV-cache decode attention
== full causal attention; the whole stack stepped, prefilled in ragged chunks, or run offline
agrees; batch invariance under desynchronised lengths, resets and prefills; the bf16 profile."""
import pytest
import torch

from gpu.model import thinker as TH
from gpu.model import thinker_weights as THW
from wave_actors.core.text import BOS, EOS, PAD
from tests.tensorkit import _no_grad, rel  # noqa: F401 (the fixture registers by import)

CFG = THW.ThinkerConfig.tiny()




def model(seed=0, dtype=None):
    """Tiny thinker, §8 init with norms, D and conv biases perturbed so the tests see them."""
    g = torch.Generator().manual_seed(seed)
    sd = THW.init_random(CFG, g)
    for k, v in sd.items():
        if k.endswith(("norm.weight", "norm_f.weight", ".D")):
            sd[k] = 1.0 + 0.3 * torch.randn(v.shape, generator=g)
        elif k.endswith("conv1d.bias"):
            sd[k] = 0.3 * torch.randn(v.shape, generator=g)
    m = TH.Thinker(CFG, dtype=dtype)
    m.load_named(sd)
    return m


def test_tiny_config_has_every_layer_kind_and_special_tokens():
    assert set(CFG.pattern) == set("M-*") and CFG.pattern.count("*") >= 2
    assert max(BOS, EOS, PAD, 11, 20, 21, 22, 1000 + 255) < CFG.vocab
    dt = torch.nn.functional.softplus(THW.init_random(CFG)[f"{THW.PREFIX}llm.layers.0.mixer.dt_bias"])
    assert dt.max() > 30 and dt.min() < 0.1                       # huge-Δ heads and ordinary ones


def step_mamba(mixer, u, conv, ssm, chunk=1):
    ys = []
    for t in range(0, u.shape[1], chunk):
        piece = u[:, t:t + chunk]
        valid = torch.ones(piece.shape[:2], dtype=torch.bool)
        y, conv, ssm = mixer.forward_chunk(piece, conv, ssm, valid)
        ys.append(y)
    return torch.cat(ys, 1), conv, ssm


@pytest.mark.parametrize("chunk", [1, 4])
def test_mamba_step_equals_ssd_sequence(chunk):
    mixer = model(seed=1).llm.layers[0].mixer
    g = torch.Generator().manual_seed(2)
    u = torch.randn(3, 11, CFG.hidden, generator=g)
    conv0 = torch.zeros(3, CFG.conv_dim, CFG.conv_kernel - 1)
    ssm0 = torch.zeros(3, CFG.mamba_heads, CFG.mamba_head_dim, CFG.d_state)
    y, conv, ssm = step_mamba(mixer, u, conv0, ssm0, chunk)
    y_ref, conv_ref, ssm_ref = mixer.forward_sequence(u)
    assert rel(y, y_ref) < 1e-5 and rel(ssm, ssm_ref) < 1e-5
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ssm, ssm_ref, rtol=1e-5, atol=1e-4)   # |S| ~ 30 in the huge-Δ heads
    torch.testing.assert_close(conv, conv_ref, rtol=1e-5, atol=1e-6)
    assert ssm.abs().max() > 1 and torch.isfinite(y).all()


def test_mamba_masked_positions_leave_state_untouched():
    mixer = model(seed=3).llm.layers[0].mixer
    g = torch.Generator().manual_seed(4)
    u = torch.randn(2, 6, CFG.hidden, generator=g)
    conv = torch.randn(2, CFG.conv_dim, CFG.conv_kernel - 1, generator=g)
    ssm = torch.randn(2, CFG.mamba_heads, CFG.mamba_head_dim, CFG.d_state, generator=g)
    valid = torch.tensor([[True] * 4 + [False] * 2, [False] * 6])
    _, conv2, ssm2 = mixer.forward_chunk(u, conv, ssm, valid)
    _, conv4, ssm4 = step_mamba(mixer, u[:1, :4], conv[:1], ssm[:1])
    torch.testing.assert_close(ssm2[:1], ssm4, rtol=1e-5, atol=1e-4)   # |S| ~ 30 in huge-Δ heads
    torch.testing.assert_close(conv2[:1], conv4, rtol=1e-5, atol=1e-6)
    assert torch.equal(ssm2[1], ssm[1]) and torch.equal(conv2[1], conv[1])


def test_decode_attention_with_kv_cache_equals_causal_attention():
    m = model(seed=5)
    attn_layer = CFG.pattern.index("*")
    mixer, j = m.llm.layers[attn_layer].mixer, CFG.layer_slot[attn_layer]
    g = torch.Generator().manual_seed(6)
    T = 9
    u = torch.randn(3, T, CFG.hidden, generator=g)
    state = TH.ThinkerState.alloc(CFG, 5, 16)
    slots = torch.tensor([4, 1, 2])
    ys = []
    for t in range(T):
        length = torch.full((3,), t)
        ys.append(mixer.forward_chunk(u[:, t:t + 1], state.k[j], state.v[j], slots, length, torch.ones(3, 1, dtype=torch.bool)))
    y_ref = mixer.forward_sequence(u)
    torch.testing.assert_close(torch.cat(ys, 1), y_ref, rtol=1e-5, atol=1e-5)
    k_ref = mixer.k_proj(u).unflatten(-1, (CFG.kv_heads, CFG.head_dim))
    torch.testing.assert_close(state.k[j][slots, :T], k_ref, rtol=1e-5, atol=1e-6)
    assert state.k[j][[0, 3]].abs().max() == 0                    # other slots untouched


def fused_inputs(m, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(0, CFG.vocab, (B, T), generator=g)
    func = torch.randint(0, CFG.vocab, (B, T), generator=g)
    audio = torch.randn(B, T, CFG.hidden, generator=g)
    return text, audio, func


def test_thinker_steps_equal_forward_sequence():
    """8 positions through 6 layers: fp32 chains of matmuls and a scan, so 1e-5 relative."""
    m = model(seed=7)
    text, audio, func = fused_inputs(m, 3, 8, seed=8)
    state = TH.ThinkerState.alloc(CFG, 4, 12)
    slots = torch.tensor([3, 0, 2])
    outs = [m.step(state, audio[:, t], text[:, t], func[:, t], slots) for t in range(8)]
    ref = m.heads(m.forward_sequence(m.fuse(text, audio, func)).flatten(0, 1))
    logits = torch.stack([o.text_logits for o in outs], 1).flatten(0, 1)
    flogits = torch.stack([o.func_logits for o in outs], 1).flatten(0, 1)
    assert rel(logits, ref.text_logits) < 1e-5 and rel(flogits, ref.func_logits) < 1e-5
    assert torch.equal(torch.stack([o.text for o in outs], 1).flatten(), ref.text)
    assert torch.equal(torch.stack([o.func for o in outs], 1).flatten(), ref.func)
    assert torch.equal(state.length[slots], torch.full((3,), 8)) and state.length[1] == 0
    assert torch.isfinite(logits).all() and logits.std() > 0.1


def test_fusion_weights():
    m = model(seed=9)
    a = torch.randn(1, CFG.hidden)
    x = m.fuse(torch.tensor([5]), a, torch.tensor([7]))
    E = m.embed_tokens.weight
    torch.testing.assert_close(x, E[5] + a + 2.0 * E[7])


def prompt(seed, n):
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.tensor([BOS]), torch.randint(1000, 1256, (n,), generator=g), torch.tensor([EOS])])


def prefill_in_chunks(m, state, prompts, slots, chunk):
    """Ragged prompts, chunk positions per call; a session whose prompt is done gets n_valid = 0."""
    longest = max(len(p) for p in prompts)
    for s in range(0, longest, chunk):
        toks = torch.full((len(prompts), chunk), PAD)
        n = torch.zeros(len(prompts), dtype=torch.long)
        for b, p in enumerate(prompts):
            piece = p[s:s + chunk]
            toks[b, :len(piece)], n[b] = piece, len(piece)
        m.prefill(state, toks, n, slots)


def test_chunked_prefill_equals_position_by_position_and_offline():
    m = model(seed=10)
    prompts = [prompt(11, 7), prompt(12, 2), prompt(13, 12)]
    text, audio, func = fused_inputs(m, 3, 4, seed=14)
    slots = torch.tensor([1, 4, 2])
    chunked = TH.ThinkerState.alloc(CFG, 5, 24)
    prefill_in_chunks(m, chunked, prompts, slots, chunk=5)
    out = [m.step(chunked, audio[:, t], text[:, t], func[:, t], slots) for t in range(4)]
    assert chunked.length[slots].tolist() == [len(p) + 4 for p in prompts]
    for b, p in enumerate(prompts):
        single = TH.ThinkerState.alloc(CFG, 1, 24)
        prefill_in_chunks(m, single, [p], torch.tensor([0]), chunk=1)
        ref = [m.step(single, audio[b:b + 1, t], text[b:b + 1, t], func[b:b + 1, t], torch.tensor([0])) for t in range(4)]
        pad = torch.full_like(p, PAD)
        x = torch.cat([m.fuse(pad, m.embed_tokens(p), pad), m.fuse(text[b], audio[b], func[b])])
        offline = m.heads(m.forward_sequence(x[None])[0, len(p):])
        for t in range(4):
            torch.testing.assert_close(out[t].text_logits[b], ref[t].text_logits[0], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(out[t].text_logits[b], offline.text_logits[t], rtol=1e-5, atol=1e-5)
            assert out[t].text[b] == ref[t].text[0] == offline.text[t]
            assert out[t].func[b] == ref[t].func[0] == offline.func[t]


def test_thinker_batch_invariance_resets_and_prefills():
    m = model(seed=15)
    T = 6
    text, audio, func = fused_inputs(m, 3, T, seed=16)
    alone = TH.ThinkerState.alloc(CFG, 6, 32)
    prefill_in_chunks(m, alone, [prompt(17, 4)], torch.tensor([3]), chunk=3)
    ref = [m.step(alone, audio[:1, t], text[:1, t], func[:1, t], torch.tensor([3])) for t in range(T)]

    state = TH.ThinkerState.alloc(CFG, 6, 32)
    prefill_in_chunks(m, state, [prompt(18, 9), prompt(17, 4)], torch.tensor([5, 3]), chunk=3)
    for t in range(T):
        if t == 2:                                                # another slot resets and re-prefills
            state.reset(torch.tensor([5]))
            prefill_in_chunks(m, state, [prompt(19, 3)], torch.tensor([5]), chunk=2)
        if t == 4:
            prefill_in_chunks(m, state, [prompt(20, 5)], torch.tensor([0]), chunk=4)
        out = m.step(state, audio[:, t], text[:, t], func[:, t], torch.tensor([3, 5, 0]))
        torch.testing.assert_close(out.text_logits[0], ref[t].text_logits[0], rtol=1e-5, atol=1e-5)
        assert out.text[0] == ref[t].text[0] and out.func[0] == ref[t].func[0]
    assert len(set(state.length[[3, 5, 0]].tolist())) == 3       # really desynchronised

    state.reset(torch.tensor([3]))                                # a reset slot is a fresh one
    prefill_in_chunks(m, state, [prompt(17, 4)], torch.tensor([3]), chunk=3)
    for t in range(T):
        out = m.step(state, audio[:1, t], text[:1, t], func[:1, t], torch.tensor([3]))
        torch.testing.assert_close(out.text_logits, ref[t].text_logits, rtol=1e-6, atol=1e-6)


def test_bf16_profile_keeps_fp32_ssm_state():
    m32 = model(seed=21)
    m16 = TH.Thinker(CFG, dtype=torch.bfloat16)
    m16.load_named({THW.PREFIX + k: v for k, v in m32.state_dict().items()})
    text, audio, func = fused_inputs(m32, 2, 5, seed=22)
    s32 = TH.ThinkerState.alloc(CFG, 2, 8)
    s16 = TH.ThinkerState.alloc(CFG, 2, 8, dtype=torch.bfloat16)
    assert s16.ssm.dtype == torch.float32 and s16.conv.dtype == s16.k.dtype == torch.bfloat16
    slots = torch.arange(2)
    for t in range(5):
        o32 = m32.step(s32, audio[:, t], text[:, t], func[:, t], slots)
        o16 = m16.step(s16, audio[:, t], text[:, t], func[:, t], slots)
        assert torch.isfinite(o16.text_logits).all() and o16.text_logits.dtype == torch.float32
        assert rel(o16.text_logits, o32.text_logits) < 5e-2
    assert rel(s16.ssm, s32.ssm) < 5e-2
