"""Reference talker (gpu/model/talker/) on the tiny config: caching, warm-up, CFG, batching."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from gpu.model.codec import Codec, CodecConfig, CodecState, init_random as codec_random, load_codec
from gpu.model.talker.state import TalkerInputs, TalkerState
from gpu.model.talker.config import TalkerConfig
from gpu.model.talker.talker import PREFIX, Talker
from gpu.model.talker.weights import init_random, integer_buffers, load_talker, param_shapes
from wave_actors.core.text import EOS, PAD

CFG = TalkerConfig.tiny()
RTOL, ATOL = 1e-5, 1e-5


def tiny_weights(cfg: TalkerConfig = CFG, seed: int = 0) -> dict:
    """§8 weights, with norms, gate and residual_scale perturbed: at identity they would hide a
    norm applied in the wrong place."""
    g = torch.Generator().manual_seed(seed)
    w = init_random(cfg, g)
    for name, t in w.items():
        if name.endswith(("norm.weight", ".gate", "residual_scale", f"mlp_stack.{cfg.mog_layers}.weight")):
            w[name] = t + 0.3 * torch.randn(t.shape, generator=g)
    return w


def make_talker(cfg: TalkerConfig = CFG, weights: dict | None = None) -> Talker:
    with torch.device("meta"):
        talker = Talker(cfg)
    load_talker(talker, weights if weights is not None else tiny_weights(cfg))
    return talker




@pytest.fixture(scope="module")
def talker(one_thread) -> Talker:
    return make_talker()


def inputs(b: int, seed: int, cfg: TalkerConfig = CFG, y=None, idle=None) -> TalkerInputs:
    g = torch.Generator().manual_seed(seed)
    return TalkerInputs(
        y if y is not None else torch.randint(100, cfg.text_vocab, (b,), generator=g),
        torch.rand(b, cfg.n_steps, cfg.n_mixtures, generator=g),
        torch.randn(b, cfg.n_steps, cfg.latent, generator=g),
        idle if idle is not None else torch.zeros(b, dtype=torch.bool))


def stack(parts: list[TalkerInputs]) -> TalkerInputs:
    return TalkerInputs(*(torch.cat([getattr(p, f.name) for p in parts])
                          for f in dataclasses.fields(TalkerInputs)))


def live_state(talker, slots, max_slots=4, positions=24, **kw) -> TalkerState:
    state = TalkerState.alloc(talker.cfg, max_slots, positions, **kw)
    talker.warmup(state, torch.tensor(slots), talker.cfg.n_warmup)
    return state


# ----------------------------------------------------------------------------- names, counts

@pytest.mark.parametrize("cfg", [TalkerConfig.tiny(), TalkerConfig.full()], ids=["tiny", "full"])
def test_param_shapes_are_the_module_names(cfg):
    with torch.device("meta"):
        talker = Talker(cfg)
    module = {PREFIX + k: v for k, v in talker.state_dict().items()}
    shapes = param_shapes(cfg)
    assert set(shapes) == set(module)
    assert {n: tuple(t.shape) for n, t in module.items()} == shapes
    assert {n for n, t in module.items() if not t.is_floating_point()} == integer_buffers(cfg)
    assert "tts_model.tts_model.backbone.layers.0.self_attn.q_proj.weight" in shapes
    assert shapes["tts_model.tts_model.mog_head.low_mat"] == (cfg.n_mixtures, cfg.latent, cfg.low_rank)


def test_full_param_counts_match_model_md():
    cfg = TalkerConfig.full()
    groups = {"backbone": 0, "char": 0, "mog": 0, "misc": 0}
    for name, shape in param_shapes(cfg).items():
        if name in integer_buffers(cfg):
            continue
        n = torch.Size(shape).numel()
        key = ("backbone" if ".tts_model.backbone." in name else "char" if ".embed_subword." in name
               else "mog" if ".mog_head." in name else "misc")
        groups[key] += n
    assert {k: round(v / 1e6) for k, v in groups.items()} == \
        {"backbone": 595, "char": 23, "mog": 159, "misc": 21}
    with torch.device("meta"):
        talker = Talker(cfg)
    total = sum(p.numel() for p in talker.state_dict().values() if p.is_floating_point())
    assert total == sum(groups.values()) and round(total / 1e9, 3) == 0.797    # docs/MODEL.md §4


def test_init_random_follows_model_md_8():
    w = init_random(CFG, torch.Generator().manual_seed(1))
    net = "tts_model.tts_model."
    assert w["tts_model._control_codes"].tolist() == [CFG.codebook_size + 2, CFG.codebook_size + 1,
                                                      CFG.codebook_size]
    assert all(w[n].dtype == torch.int32 for n in integer_buffers(CFG))
    sil = w["tts_model.codec_silence_tokens"]
    assert 0 <= sil.min() and sil.max() < CFG.codebook_size
    assert set(w[net + "embed_subword.bos_eos_emb.special_flags"].unique().tolist()) == {0, 1, 2}
    assert not w[net + "gated_fusion_audio_text.gate"].any()
    assert not w[net + "backbone.layers.0.input_layernorm.weight"].any()
    assert abs(w[net + "rvq_embs"].std().item() - 1) < 0.05
    q = w[net + "backbone.layers.0.self_attn.q_proj.weight"]
    assert abs(q.std().item() * CFG.hidden ** 0.5 - 1) < 0.1


# --------------------------------------------------------------------------- attention cache

def reference_backbone(talker: Talker, x: torch.Tensor, window: bool = True) -> torch.Tensor:
    """Independent full-sequence Gemma3 over x [R, T, H] at positions 0..T-1: no cache,
    HF rotate_half RoPE, SDPA with an explicit causal (+ sliding) mask."""
    cfg, bb = talker.cfg, talker.tts_model.backbone
    r, t, _ = x.shape
    d = cfg.head_dim
    pos = torch.arange(t)
    for i, layer in enumerate(bb.layers):
        att = layer.self_attn
        h = layer.input_layernorm(x)
        heads = lambda z: z.view(r, t, -1, d).transpose(1, 2)              # noqa: E731
        q, k, v = att.q_norm(heads(att.q_proj(h))), att.k_norm(heads(att.k_proj(h))), heads(att.v_proj(h))
        theta = cfg.rope_theta_full if cfg.full_layers[i] else cfg.rope_theta_local
        inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
        emb = torch.cat([pos[:, None] * inv] * 2, dim=-1)
        rot = lambda z: z * emb.cos() + torch.cat([-z[..., d // 2:], z[..., :d // 2]], -1) * emb.sin()  # noqa: E731
        mask = pos[None, :] <= pos[:, None]
        if window and not cfg.full_layers[i]:
            mask &= pos[None, :] > pos[:, None] - cfg.sliding_window
        o = F.scaled_dot_product_attention(rot(q), rot(k), v, attn_mask=mask, scale=cfg.attn_scale)
        x = x + layer.post_attention_layernorm(att.o_proj(o.transpose(1, 2).reshape(r, t, -1)))
        x = x + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(x)))
    return bb.norm(x)


@torch.no_grad()
def test_decode_with_kv_cache_equals_full_causal_attention(talker):
    t = 3 * CFG.sliding_window                       # long enough for the window to bite
    x = torch.randn(2, t, CFG.hidden, generator=torch.Generator().manual_seed(3))
    ref = reference_backbone(talker, x)
    assert (ref - reference_backbone(talker, x, window=False)).abs().max() > 1e-2   # it bites
    bb, slot = talker.tts_model.backbone, torch.tensor([1])
    state = TalkerState.alloc(CFG, 3, t)
    steps = [bb(x[None, :, i:i + 1], torch.tensor([[i]]), state, slot) for i in range(t)]
    torch.testing.assert_close(torch.cat(steps, dim=2)[0], ref, rtol=RTOL, atol=ATOL)
    chunk = TalkerState.alloc(CFG, 3, t)                      # prefill: all T in one call
    torch.testing.assert_close(bb(x[None], torch.arange(t)[None], chunk, slot)[0], ref,
                               rtol=RTOL, atol=ATOL)
    assert not state.k[[0, 2]].any()                          # other slots untouched


# ------------------------------------------------------------------------------------ warm-up

@torch.no_grad()
def test_warmup_in_chunks_equals_one_go(talker):
    n, both = CFG.n_warmup, torch.tensor([0, 2])
    one = TalkerState.alloc(CFG, 4, 20)
    talker.warmup(one, both, n)
    chunked = TalkerState.alloc(CFG, 4, 20)           # desynchronised chunks of various sizes
    for slots, count in (([0], 3), ([0, 2], 2), ([2], 1), ([0, 2], n - 5), ([2], 2)):
        talker.warmup(chunked, torch.tensor(slots), count)
    assert one.position.tolist() == chunked.position.tolist() == [n, 0, n, 0]
    torch.testing.assert_close(chunked.k, one.k, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(chunked.v, one.v, rtol=RTOL, atol=ATOL)
    inp = inputs(2, seed=5)
    a, b = talker.step(one, inp, both), talker.step(chunked, inp, both)
    assert torch.equal(a.codes, b.codes)
    torch.testing.assert_close(a.hidden, b.hidden, rtol=RTOL, atol=ATOL)


@torch.no_grad()
def test_warmup_rows_take_the_inputs_model_md_names():
    """Aria row i feeds position i; the char encoder (mask) reaches only the last 2 rows; the
    silence codes and bos_emb only the last row. Checked on layer-0 values (no mixing yet)."""
    base = tiny_weights()
    n, net = CFG.n_warmup, "tts_model.tts_model."

    def v0(**changes):
        w = dict(base)
        for name, fn in changes.items():
            w[name] = fn(w[name].clone())
        state = TalkerState.alloc(CFG, 1, n)
        make_talker(weights=w).warmup(state, torch.tensor([0]), n)
        return state.v[0, 0, 0].transpose(0, 1)                         # [P, heads, D]

    ref = v0()

    def changed_rows(**changes):
        diff = (v0(**changes) - ref).abs().flatten(1).amax(1)
        return (diff > 1e-6).nonzero().flatten().tolist()

    def bump_aria(t):
        t[0, 2] += 1
        return t

    assert changed_rows(**{"tts_model.audio_prompt_latents.Aria": bump_aria}) == [2]
    assert changed_rows(**{net + "embed_subword.proj_embedding.weight": lambda t: t * 2}) == [n - 2, n - 1]
    assert changed_rows(**{net + "bos_emb": lambda t: t + 1}) == [n - 1]
    assert changed_rows(**{"tts_model.codec_silence_tokens": lambda t: (t + 1) % CFG.codebook_size}) == [n - 1]


# -------------------------------------------------------------------------------- CFG, bf16

@torch.no_grad()
def test_cfg_on_and_off_differ_only_in_the_guidance(talker):
    slots = torch.tensor([0, 1, 3])
    on = live_state(talker, [0, 1, 3])
    off = live_state(talker, [0, 1, 3], profile="dense", kv_dtype=torch.float32)
    assert (on.rows, off.rows) == (2, 1)
    codes_differ = False
    for t in range(3):
        inp = inputs(3, seed=10 + t)
        a, b = talker.step(on, inp, slots), talker.step(off, inp, slots)
        # Row c of the CFG backbone is exactly the dense row: u never leaks into c.
        torch.testing.assert_close(a.hidden[:, 0], b.hidden[:, 0], rtol=RTOL, atol=ATOL)
        codes_differ |= not torch.equal(a.codes, b.codes)
        off.prev_codes[slots] = on.prev_codes[slots]                   # same history
    torch.testing.assert_close(on.k[:, :, 0], off.k[:, :, 0], rtol=RTOL, atol=ATOL)
    assert codes_differ                                                # guidance changes codes
    # With guidance scale 0 the CFG profile must produce the dense codes.
    flat = make_talker(dataclasses.replace(CFG, cfg_scale=0.0))
    on, off = live_state(flat, [0, 1, 3]), live_state(flat, [0, 1, 3], profile="dense")
    for t in range(3):
        inp = inputs(3, seed=10 + t)
        assert torch.equal(flat.step(on, inp, slots).codes, flat.step(off, inp, slots).codes)


@torch.no_grad()
def test_guidance_formula(talker):
    head = talker.tts_model.mog_head
    x = torch.randn(5, 2, CFG.hidden, generator=torch.Generator().manual_seed(4))
    m_c, m_u = head.guided(x[:, :1]), head.guided(x[:, 1:])           # one row each: no CFG
    torch.testing.assert_close(head.guided(x), m_c + 0.2 * (m_c - m_u), rtol=RTOL, atol=ATOL)


@torch.no_grad()
def test_bf16_kv_stays_close_to_fp32(talker):
    slots = torch.tensor([2, 0])
    s16 = live_state(talker, [2, 0], profile="dense")
    s32 = live_state(talker, [2, 0], profile="dense", kv_dtype=torch.float32)
    assert s16.k.dtype == torch.bfloat16
    for t in range(4):
        inp = inputs(2, seed=20 + t)
        a, b = talker.step(s16, inp, slots), talker.step(s32, inp, slots)
        assert torch.isfinite(a.hidden).all()
        # bf16 keeps 8 mantissa bits (rel. 4e-3 per K/V element); the output is RMS-normed.
        assert (a.hidden - b.hidden).abs().max() < 1e-2 * b.hidden.abs().max()
        s16.prev_codes[slots] = s32.prev_codes[slots]                  # same history


# ------------------------------------------------------------------------- batch invariance

@torch.no_grad()
def run_session_a(talker, codec, others: bool, disturb: bool):
    """Session A in slot 2 for 3 frames; optionally with B (slot 0, one frame ahead) and C (slot 3)
    in the same batches, or with slot 0 being reset and warmed up between A's frames."""
    state, cstate = TalkerState.alloc(CFG, 4, 24), CodecState.alloc(codec.cfg, 4)
    talker.warmup(state, torch.tensor([2, 0, 3] if others else [2]), CFG.n_warmup)
    if others:
        talker.step(state, inputs(1, seed=99), torch.tensor([0]))
    out = []
    for t in range(3):
        a = inputs(1, seed=30 + t)
        if others:
            slots = torch.tensor([3, 2, 0])
            res = talker.step(state, stack([inputs(1, seed=40 + t), a, inputs(1, seed=50 + t)]), slots)
            pcm = codec.step(cstate, res.codec_codes, slots)[1]
            res = (res.codes[1], res.hidden[1])
        else:
            r = talker.step(state, a, torch.tensor([2]))
            pcm, res = codec.step(cstate, r.codec_codes, torch.tensor([2]))[0], (r.codes[0], r.hidden[0])
        if disturb:
            state.reset(torch.tensor([0]))
            cstate.reset(torch.tensor([0]))
            talker.warmup(state, torch.tensor([0]), 3)
            codec.step(cstate, torch.randint(0, CFG.codebook_size, (1, CFG.n_codebooks)), torch.tensor([0]))
        out.append((*res, pcm))
    return out


def test_batch_invariance_and_slot_isolation(talker):
    ccfg = dataclasses.replace(CodecConfig.tiny(), n_codebooks=CFG.n_codebooks,
                               codebook_size=CFG.codebook_size)
    with torch.device("meta"):
        codec = Codec(ccfg)
    load_codec(codec, codec_random(ccfg, torch.Generator().manual_seed(0)))
    alone = run_session_a(talker, codec, others=False, disturb=False)
    batched = run_session_a(talker, codec, others=True, disturb=False)
    disturbed = run_session_a(talker, codec, others=False, disturb=True)
    for (c0, h0, p0), (c1, h1, p1), (c2, h2, p2) in zip(alone, batched, disturbed):
        assert torch.isfinite(h0).all() and torch.isfinite(p0).all() and p0.shape == (1764,)
        assert ((0 <= c0) & (c0 < CFG.codebook_size)).all()
        assert torch.equal(c0, c1)
        torch.testing.assert_close(h1, h0, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(p1, p0, rtol=RTOL, atol=ATOL)
        assert torch.equal(c0, c2) and torch.equal(h0, h2) and torch.equal(p0, p2)


# ------------------------------------------------------------------ substitution, text, audio

def test_silence_substitution_rules(talker):
    g = torch.Generator().manual_seed(6)
    codes = torch.randint(0, CFG.codebook_size, (4, CFG.n_codebooks), generator=g)
    codes[3, 5] = CFG.control_codes[1]                                # an EOS control code
    y = torch.tensor([EOS, PAD, PAD, 500])
    idle = torch.tensor([False, True, False, False])
    prev, codec = talker.substitute(codes, y, idle)
    sil = talker.codec_silence_tokens.long().expand(4, -1)
    use_silence_prev = torch.tensor([True, True, False, False])       # EOS; PAD while idle
    use_silence_codec = torch.tensor([False, True, False, True])      # PAD while idle; code ≥ V
    torch.testing.assert_close(prev, torch.where(use_silence_prev[:, None], sil, codes))
    torch.testing.assert_close(codec, torch.where(use_silence_codec[:, None], sil, codes))
    state = live_state(talker, [1])
    out = talker.step(state, inputs(1, seed=7, y=torch.tensor([EOS])), torch.tensor([1]))
    assert torch.equal(state.prev_codes[1], sil[0]) and not torch.equal(out.codes[0], sil[0])
    assert state.position[1] == CFG.n_warmup + 1


def test_reset_reinitialises_only_its_slots(talker):
    state = live_state(talker, [0, 1, 2])
    talker.step(state, inputs(3, seed=8), torch.tensor([0, 1, 2]))
    before = dataclasses.replace(state, k=state.k.clone(), v=state.v.clone(),
                                 position=state.position.clone(), prev_codes=state.prev_codes.clone())
    state.reset(torch.tensor([1]))
    assert state.position.tolist() == [CFG.n_warmup + 1, 0, CFG.n_warmup + 1, 0]
    assert (state.prev_codes[1] == CFG.pad_code).all()
    keep = [0, 2, 3]
    assert torch.equal(state.k[keep], before.k[keep]) and torch.equal(state.v[keep], before.v[keep])
    assert torch.equal(state.prev_codes[keep], before.prev_codes[keep])


@torch.no_grad()
def test_a_reset_slot_hears_nothing_of_its_stale_rows(talker):
    """A reset leaves the KV rows as the last session wrote them; nothing at or past a slot's
    position may reach its output, NaN included. Bug caught: a reader that multiplies a stale
    row by probability 0 (0·NaN) instead of leaving it out, or a reset that no longer restarts
    the position."""
    fresh = live_state(talker, [1])
    used = live_state(talker, [1])
    used.k[1].fill_(float("nan"))
    used.v[1].fill_(float("nan"))
    used.position[1] = 5
    used.reset(torch.tensor([1]))
    talker.warmup(used, torch.tensor([1]), talker.cfg.n_warmup)
    for t in range(3):
        want = talker.step(fresh, inputs(1, seed=20 + t), torch.tensor([1]))
        got = talker.step(used, inputs(1, seed=20 + t), torch.tensor([1]))
        assert torch.equal(got.codes, want.codes), t
        assert torch.equal(got.hidden, want.hidden)


@torch.no_grad()
def test_audio_embedding_pad_is_zero(talker):
    m = talker.tts_model
    pad = torch.full((1, CFG.n_codebooks), CFG.pad_code)
    assert not m.audio_embedding(pad).any()
    codes = torch.randint(0, CFG.codebook_size, (1, CFG.n_codebooks))
    partial = codes.clone()
    partial[0, 3] = CFG.pad_code
    rest = sum(m.rvq_embs[q, codes[0, q]] for q in range(CFG.n_codebooks) if q != 3)
    torch.testing.assert_close(m.audio_embedding(partial)[0], m.embed_code(rest), rtol=RTOL, atol=ATOL)
