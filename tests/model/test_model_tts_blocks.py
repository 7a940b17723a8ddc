"""Talker building blocks against their formulas, written out by hand (docs/MODEL.md §2.5):
Gemma RMSNorm and MLP, gated fusion with the CFG null row, the T5Gemma char encoder, the char table."""
import pytest
import torch

from gpu.model.talker.text import CharTable
from wave_actors.core.text import PAD, ByteFallbackCodec
from tests.model.test_model_tts import ATOL, CFG, RTOL, make_talker




@pytest.fixture(scope="module")
def talker(one_thread):
    return make_talker()


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w)


def test_gemma_blocks_follow_the_formulas(talker):
    layer = talker.tts_model.backbone.layers[0]
    x = torch.randn(3, CFG.hidden, generator=torch.Generator().manual_seed(11)) * 4
    norm = layer.input_layernorm
    torch.testing.assert_close(norm(x), rms(x, norm.weight), rtol=RTOL, atol=ATOL)
    mlp = layer.mlp
    g = mlp.gate_proj(x)
    gelu_tanh = 0.5 * g * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (g + 0.044715 * g ** 3)))
    torch.testing.assert_close(mlp(x), mlp.down_proj(gelu_tanh * mlp.up_proj(x)), rtol=RTOL, atol=ATOL)


@torch.no_grad()
def test_fusion_rows_follow_the_formula(talker):
    m = talker.tts_model
    f = m.gated_fusion_audio_text
    g = torch.Generator().manual_seed(12)
    a, t = torch.randn(3, CFG.hidden, generator=g) * 5, torch.randn(3, CFG.hidden, generator=g)

    def fused(a, t):
        gate = torch.sigmoid(f.gate)
        z = gate * (a / CFG.n_codebooks @ f.audio_proj.weight.T + f.audio_proj.bias) \
            + (1 - gate) * (t @ f.text_proj.weight.T + f.text_proj.bias)
        return rms(torch.sigmoid(f.residual_scale) * z, f.final_norm.weight)

    both = m.fuse(a, t, rows=2)
    torch.testing.assert_close(both[:, 0], fused(a, t), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(both[:, 1], fused(a, m.null_emb.expand(3, -1)), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(m.fuse(a, t, rows=1), both[:, :1], rtol=RTOL, atol=ATOL)


@torch.no_grad()
def test_char_encoder_follows_the_formula(talker):
    """One T5Gemma layer by hand: √H-scaled embeddings, rotate-half RoPE θ 1e4, 1/√q_scalar,
    50·tanh(s/50) soft-cap, key mask, masked mean, projection, mask, + flag embeddings."""
    emb = talker.tts_model.embed_subword
    layer, d = emb.backbone.encoder.layers[0], CFG.head_dim
    att = layer.self_attn
    ys = torch.tensor([5, 700, 1999])
    out = emb(ys, torch.tensor([1.0, 1.0, 0.5]))
    for i, y in enumerate(ys.tolist()):
        n = int(emb.char_lengths[y])
        x = emb.embed_tokens.weight[emb.char_ids[y, :CFG.max_chars]] * CFG.hidden ** 0.5   # [M, H]
        h = layer.pre_self_attn_layernorm(x)
        heads = lambda z: z.view(CFG.max_chars, CFG.n_heads, d).transpose(0, 1)   # noqa: E731
        pos = torch.arange(CFG.max_chars)[:, None] / CFG.char_rope_theta ** (torch.arange(0, d, 2) / d)
        cos, sin = torch.cat([pos.cos()] * 2, -1), torch.cat([pos.sin()] * 2, -1)
        rot = lambda z: z * cos + torch.cat([-z[..., d // 2:], z[..., :d // 2]], -1) * sin  # noqa: E731
        q, k, v = rot(heads(att.q_proj(h))), rot(heads(att.k_proj(h))), heads(att.v_proj(h))
        s = 50 * torch.tanh(q @ k.transpose(1, 2) / CFG.query_pre_attn_scalar ** 0.5 / 50)
        s[..., n:] = float("-inf")
        o = (s.softmax(-1) @ v).transpose(0, 1).reshape(CFG.max_chars, -1)
        x = x + layer.post_self_attn_layernorm(att.o_proj(o))
        x = x + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(x)))
        pooled = emb.backbone.encoder.norm(x)[:n].mean(0)
        flags = emb.subword_flag_emb.cont_emb.weight[emb.subword_flag_emb.is_continuation[y]] \
            + emb.bos_eos_emb.special_emb.weight[emb.bos_eos_emb.special_flags[y]]
        want = emb.proj_embedding(pooled) * (0.5 if i == 2 else 1.0) + flags
        torch.testing.assert_close(out[i], want, rtol=RTOL, atol=ATOL)


def test_char_table_from_pieces():
    pieces = ByteFallbackCodec().char_pieces(CFG.text_vocab)
    pieces[1500], pieces[1501] = "hello", "~\u00e9a"                  # é is not a table char
    table = CharTable.from_pieces(pieces, CFG)
    index = {c: i for i, c in enumerate(chr(b) for b in range(128))}    # single chars, id order
    assert table.lengths[1500] == 5 and table.ids[1500, :5].tolist() == [index[c] for c in "hello"]
    assert table.lengths[1501] == 2 and table.ids[1501, :2].tolist() == [index["~"], index["a"]]
    assert (table.ids[1500, 5:] == CFG.n_chars).all() and table.lengths[PAD] == 0
    pieces[1502] = "x" * (CFG.max_chars + 1)
    with pytest.raises(ValueError):
        CharTable.from_pieces(pieces, CFG)
    syn = CharTable.synthetic(CFG)
    assert syn.lengths.min() == 1 and syn.lengths.max() == CFG.max_chars
    real = torch.arange(CFG.max_chars) < syn.lengths[:, None].long()
    assert (syn.ids[~real] == CFG.n_chars).all() and (syn.ids[real] < CFG.n_chars).all()


@torch.no_grad()
def test_char_encoder_sees_only_the_real_characters(talker):
    emb = talker.tts_model.embed_subword
    y, ones = torch.arange(0, CFG.text_vocab, 97), torch.ones(22)
    ref = emb(y, ones)
    assert torch.isfinite(ref).all()
    saved = emb.char_ids.clone()
    try:
        pad = torch.arange(CFG.max_chars) >= emb.char_lengths[:, None]
        emb.char_ids[pad] = 7                                          # garbage past the end
        torch.testing.assert_close(emb(y, ones), ref, rtol=RTOL, atol=ATOL)
        emb.char_ids[:, 0] = (saved[:, 0] + 1) % CFG.n_chars            # a real character
        assert (emb(y, ones) - ref).abs().amax(-1).min() > 1e-4
    finally:
        emb.char_ids.copy_(saved)
    masked = emb(y, torch.zeros(22))                                   # mask 0: only the flags
    flags = emb.subword_flag_emb(y) + emb.bos_eos_emb(y)
    torch.testing.assert_close(masked, flags, rtol=RTOL, atol=ATOL)


def test_rope_tables_are_bit_identical_to_rope():
    """The backbone's per-frame RoPE tables give exactly `apply_rope` (fewer kernels a layer)."""
    from gpu.model.talker.text import apply_rope, apply_rope_tables, rope_cos_sin, rope_tables
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 2, 4, 16, 72, generator=g) * 3                  # [B, R, T, heads, D]
    pos = torch.randint(0, 7000, (3, 4), generator=g)
    for theta in (1e4, 1e6):
        cos, sin = rope_cos_sin(pos[:, None], 72, theta)               # [B, 1, T, D/2]
        assert torch.equal(apply_rope_tables(x, rope_tables(cos, sin)), apply_rope(x, cos, sin))
