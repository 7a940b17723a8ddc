"""EAR-TTS text embedding (docs/MODEL.md §2.5 step 1) and the Gemma pieces the whole talker shares.

Algorithm: a thinker token y becomes the characters of its text, looked up in a [vocab, M_c]
table (pad id = n_chars); the characters are embedded and scaled by √H, run through one
bidirectional T5Gemma encoder layer (RoPE θ 1e4 over character positions, scores·1/√256
soft-capped as 50·tanh(s/50), keys masked to the real characters, gated GELU-tanh MLP), mean-
pooled over the real characters, projected (`proj_embedding`) and multiplied by the subword mask;
the continuation and BOS/EOS flag embeddings of y are added after the mask. Every token costs M_c
character positions whatever its length, so the work never depends on values (docs/MODEL.md §8).

Gemma conventions used here and in the backbone and MoG head: RMSNorm scales by (1 + w) and is
computed in fp32; MLPs are down(gelu_tanh(gate(x)) · up(x)) without biases; RoPE rotates halves
(HF `rotate_half`) with inv_freq = 1/θ^(2i/D).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from gpu.model.talker.config import TalkerConfig


class RMSNorm(nn.Module):
    """Gemma RMSNorm: x·rsqrt(mean(x²) + eps)·(1 + w), in fp32 whatever the input dtype."""
    fused = None            # the engine's one-launch kernel of this math (decode_ops.install)
    fused_residual = None   # and of `add_normed`'s (x, y, w_post, eps, w_next)

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))     # stored as w; the scale is 1 + w

    def forward(self, x: Tensor) -> Tensor:
        if self.fused is not None:
            return self.fused(x, self.weight, self.eps)
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


def add_normed(x: Tensor, y: Tensor, norm: RMSNorm, then: RMSNorm | None = None
               ) -> tuple[Tensor, Tensor | None]:
    """The Gemma residual step: s = x + norm(y), and then(s) for the next sublayer (None without
    `then`). One launch on the engine path, where it would otherwise be three."""
    if norm.fused_residual is not None and x.dtype == torch.float32 and (then is None or then.eps == norm.eps):
        return norm.fused_residual(x, y, norm.weight, norm.eps, None if then is None else then.weight)
    x = x + norm(y)
    return x, None if then is None else then(x)


class GatedMLP(nn.Module):
    """down(gelu_tanh(gate(x)) · up(x)), no biases (Gemma3 / T5Gemma / MoG stack)."""
    fused = None        # the engine's (mlp, x) → output: one [gate; up] matmul, one GELU·up launch

    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.fused is not None and x.dtype == torch.float32:     # the engine's kernels: fp32
            return self.fused(self, x)
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


def rope_cos_sin(pos: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos, sin [*pos.shape, head_dim/2] of the angles pos·inv_freq (fp32, HF's inv_freq)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=pos.device).float() / head_dim))
    angles = pos.float()[..., None] * inv_freq
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate halves of x [..., T, heads, D] by cos/sin [..., T, D/2] (broadcast over heads)."""
    cos, sin = cos[..., None, :], sin[..., None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rope_tables(cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """cos/sin [..., T, D/2] → ([cos | cos], [−sin | sin]) [..., T, 1, D], for `apply_rope_tables`."""
    return torch.cat([cos, cos], -1)[..., None, :], torch.cat([-sin, sin], -1)[..., None, :]


def apply_rope_tables(x: Tensor, tables: tuple[Tensor, Tensor]) -> Tensor:
    """`apply_rope` in 4 ops instead of 7 (the tables are made once per frame): x·[cos|cos] +
    [x2|x1]·[−sin|sin]. Bit-identical: x1·cos + x2·(−sin) is x1·cos − x2·sin exactly."""
    cos_full, sin_signed = tables
    return x * cos_full + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed


# ---------------------------------------------------------------------------- character table

@dataclass(frozen=True)
class CharTable:
    """Characters of every thinker token: ids int32 [vocab, M_c] (pad = n_chars), lengths [vocab]."""
    ids: Tensor
    lengths: Tensor

    @classmethod
    def from_pieces(cls, pieces: Sequence[str], cfg: "TalkerConfig") -> "CharTable":
        """TM's `build_subword_tables` rule on a list of token texts (`TextCodec.char_pieces()`).

        The character vocabulary is the single-character pieces in id order (at most n_chars);
        each piece keeps the characters found in it. A piece longer than M_c is an error: build
        the config with `max_chars` = the longest piece instead of truncating silently.
        """
        if len(pieces) != cfg.text_vocab:
            raise ValueError(f"{len(pieces)} pieces for a text vocabulary of {cfg.text_vocab}")
        char_index: dict[str, int] = {}
        for piece in pieces:
            if len(piece) == 1 and piece not in char_index:
                char_index[piece] = len(char_index)
        if len(char_index) > cfg.n_chars:
            raise ValueError(f"{len(char_index)} single-character tokens, the table holds {cfg.n_chars}")
        ids = torch.full((cfg.text_vocab, cfg.max_chars), cfg.n_chars, dtype=torch.int32)
        lengths = torch.zeros(cfg.text_vocab, dtype=torch.int32)
        for tok, piece in enumerate(pieces):
            chars = [char_index[c] for c in piece if c in char_index]
            if len(chars) > cfg.max_chars:
                raise ValueError(f"token {tok} has {len(chars)} characters > max_chars {cfg.max_chars}")
            ids[tok, : len(chars)] = torch.tensor(chars, dtype=torch.int32)
            lengths[tok] = len(chars)
        return cls(ids, lengths)

    @classmethod
    def synthetic(cls, cfg: "TalkerConfig", seed: int = 0) -> "CharTable":
        """No tokenizer (docs/MODEL.md §8): random characters, lengths uniform in 1..M_c."""
        g, cpu = torch.Generator().manual_seed(seed), torch.device("cpu")   # also under meta
        lengths = torch.randint(1, cfg.max_chars + 1, (cfg.text_vocab,), generator=g, device=cpu)
        ids = torch.randint(0, cfg.n_chars, (cfg.text_vocab, cfg.max_chars), generator=g, device=cpu)
        ids = ids.masked_fill(torch.arange(cfg.max_chars, device=cpu) >= lengths[:, None], cfg.n_chars)
        return cls(ids.to(torch.int32), lengths.to(torch.int32))


# ------------------------------------------------------------------------ character encoder

class _EncoderAttention(nn.Module):
    def __init__(self, cfg: "TalkerConfig"):
        super().__init__()
        width = cfg.n_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, width, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, width, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, width, bias=False)
        self.o_proj = nn.Linear(width, cfg.hidden, bias=False)


class EncoderLayer(nn.Module):
    """One T5Gemma encoder layer: bidirectional soft-capped self-attention, then gated MLP."""

    def __init__(self, cfg: "TalkerConfig"):
        super().__init__()
        self.cfg = cfg
        self.pre_self_attn_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.self_attn = _EncoderAttention(cfg)
        self.post_self_attn_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.mlp = GatedMLP(cfg.hidden, cfg.mlp)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        """x [N, M, H] character states, valid bool [N, M] (the real characters)."""
        cfg, att = self.cfg, self.self_attn
        n, m, _ = x.shape
        h = self.pre_self_attn_layernorm(x)
        q = att.q_proj(h).view(n, m, cfg.n_heads, cfg.head_dim)
        k = att.k_proj(h).view(n, m, cfg.n_heads, cfg.head_dim)
        v = att.v_proj(h).view(n, m, cfg.n_heads, cfg.head_dim)
        cos, sin = rope_cos_sin(torch.arange(m, device=x.device), cfg.head_dim, cfg.char_rope_theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        s = torch.einsum("nqhd,nkhd->nhqk", q, k) * cfg.attn_scale
        s = cfg.char_softcap * torch.tanh(s / cfg.char_softcap)
        # Finite fill, not -inf: a token with no characters (a special) then gets a uniform
        # softmax instead of NaN; its pooled mean is zero anyway.
        s = s.masked_fill(~valid[:, None, None, :], -1e9)
        a = torch.einsum("nhqk,nkhd->nqhd", s.softmax(-1), v).reshape(n, m, -1)
        x, h = add_normed(x, att.o_proj(a), self.post_self_attn_layernorm, self.pre_feedforward_layernorm)
        return add_normed(x, self.mlp(h), self.post_feedforward_layernorm)[0]


class _Encoder(nn.Module):
    def __init__(self, cfg: "TalkerConfig"):
        super().__init__()
        self.layers = nn.ModuleList([EncoderLayer(cfg)])
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)


class _EncoderHolder(nn.Module):            # checkpoint path `embed_subword.backbone.encoder.*`
    def __init__(self, cfg: "TalkerConfig"):
        super().__init__()
        self.encoder = _Encoder(cfg)


class _FlagEmbedding(nn.Module):
    """A small embedding indexed by a per-token integer flag table (int32 checkpoint buffers)."""

    def __init__(self, emb_name: str, table_name: str, rows: int, table_len: int, hidden: int):
        super().__init__()
        self.emb_name, self.table_name = emb_name, table_name
        self.add_module(emb_name, nn.Embedding(rows, hidden))
        self.register_buffer(table_name, torch.zeros(table_len, dtype=torch.int32))
        self.register_buffer("pad_tensor", torch.zeros((), dtype=torch.int32))

    def forward(self, y: Tensor) -> Tensor:
        flags = getattr(self, self.table_name)[y].long()
        return getattr(self, self.emb_name)(flags)


class SubwordEmbedding(nn.Module):
    """`embed_subword`: thinker token y [N] + subword mask [N] → text embedding [N, H]."""

    def __init__(self, cfg: "TalkerConfig", table: CharTable | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.n_chars + 1, cfg.hidden)
        self.proj_embedding = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.backbone = _EncoderHolder(cfg)
        self.subword_flag_emb = _FlagEmbedding("cont_emb", "is_continuation", 2,
                                               cfg.text_vocab + 1, cfg.hidden)
        self.bos_eos_emb = _FlagEmbedding("special_emb", "special_flags", 3,
                                          cfg.text_vocab, cfg.hidden)
        # The char table is tokenizer data, not a checkpoint tensor: non-persistent buffers.
        table = table or CharTable.synthetic(cfg)
        self.register_buffer("char_ids", table.ids.long(), persistent=False)        # [vocab, M_c]
        self.register_buffer("char_lengths", table.lengths.long(), persistent=False)  # [vocab]

    def forward(self, y: Tensor, mask: Tensor) -> Tensor:
        cfg = self.cfg
        chars = self.char_ids[y]                                        # [N, M_c]
        lengths = self.char_lengths[y]                                  # [N]
        valid = torch.arange(cfg.max_chars, device=y.device) < lengths[:, None]
        x = self.embed_tokens(chars) * (cfg.hidden ** 0.5)              # [N, M_c, H]
        enc = self.backbone.encoder
        x = enc.norm(enc.layers[0](x, valid))
        pooled = (x * valid[..., None]).sum(1) / lengths.clamp(min=1)[:, None]
        text = self.proj_embedding(pooled) * mask[:, None]
        # The flag embeddings are added after the mask (also at masked warm-up rows, as NeMo).
        return text + self.subword_flag_emb(y) + self.bos_eos_emb(y)
