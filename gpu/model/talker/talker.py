"""EAR-TTS talker (docs/MODEL.md §2.5): thinker token y_t + previous codes → 31 RVQ codes per frame.

Algorithm, per frame, for every session in the batch (slot-indexed state, positions per slot):
  text  = SubwordEmbedding(y_t)                      (talker/text.py)
  audio = embed_code(Σ_q rvq_embs[q][prev_q])        PAD (code ≥ codebook_size) → zero vector
  rows  = [F(audio, text), F(audio, null_emb)]       CFG rows c, u ("reference"); only c ("dense")
          F(a, t) = final_norm(σ(rs)·(σ(g)⊙audio_proj(a/Q) + (1−σ(g))⊙text_proj(t)))
  h     = Gemma3 backbone(rows) at position p, each row with its own slot-indexed KV cache;
          layers (i+1) % 6 == 0 attend to everything (RoPE θ 1e6), the others to a sliding window
          of 7500 (θ 1e4); scores scaled by 1/√256
  codes = MoG head with iterative unmasking (talker/mog.py)
  prev  ← codes, or codec_silence_tokens on EOS / PAD-while-idle; the codec gets silence codes on
          PAD-while-idle or when a code is a control code (≥ codebook_size).
Warm-up: positions 0..36 run the backbone only (K/V kept): rows 0..35 take the Aria latent as the
audio input, row 36 the silence codes + bos_emb; text [PAD]*36 + [EOS], mask [0]*35 + [1, 1].
It runs in chunks of any size; live generation starts at p = 37 with prev = [PAD]*31.
Checkpoint names, random init and loading: talker/weights.py (docs/MODEL.md §7, §8).
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from gpu.model.formats import E4M3_MAX
from gpu.model.talker.config import TalkerConfig
from gpu.model.talker.mog import MogHead, codebook_sqnorms
from gpu.model.talker.state import TalkerInputs, TalkerOutput, TalkerState
from gpu.model.talker.text import (CharTable, GatedMLP, RMSNorm, SubwordEmbedding, add_normed,
                                   apply_rope_tables, rope_cos_sin, rope_tables)
from wave_actors.core.text import EOS, PAD

KV8_HEADROOM = 4.0      # fp8 KV: the warm-up's largest key or value sits at 448 / 4

PREFIX = "tts_model."                   # the talker module's names = checkpoint names minus this


# ---------------------------------------------------------------------------------- backbone

def attend(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, window: int | None,
           scale: float) -> Tensor:
    """Masked attention of q [B, R, T, Hq, D] at positions q_pos [B, T] over a cache
    k, v [B, R, P, Hkv, D]: key j is visible iff j ≤ p and (no window or j > p − window).
    Every query sees at least itself, so no row is all −inf. → [B, R, T, Hq·D]."""
    rep = q.shape[-2] // k.shape[-2]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=-2), v.repeat_interleave(rep, dim=-2)
    kpos = torch.arange(k.shape[2], device=q.device)
    visible = kpos <= q_pos[..., None]                                   # [B, T, P]
    if window is not None:
        visible &= kpos > q_pos[..., None] - window
    s = torch.einsum("brthd,brphd->brhtp", q, k) * scale
    s = s.masked_fill(~visible[:, None, None], float("-inf"))
    # a row no query sees may be stale (a reset leaves the KV rows): its probability is 0, but
    # 0·NaN is NaN, so its values are zeroed
    v = v.masked_fill(~visible.any(1)[:, None, :, None, None], 0)
    o = torch.einsum("brhtp,brphd->brthd", s.softmax(-1), v)
    return o.flatten(-2)


class DecoderAttention(nn.Module):
    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.q_proj = nn.Linear(cfg.hidden, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.hidden, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)


class DecoderLayer(nn.Module):
    """Gemma3 layer with 4 norms; writes its K/V rows into the state, then attends."""

    def __init__(self, cfg: TalkerConfig, index: int):
        super().__init__()
        self.cfg, self.index = cfg, index
        full = cfg.full_layers[index]
        self.theta = cfg.rope_theta_full if full else cfg.rope_theta_local
        self.window = None if full else cfg.sliding_window
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.self_attn = DecoderAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.mlp = GatedMLP(cfg.hidden, cfg.mlp)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.decode_ops = None      # gpu.engine.decode_ops.TritonDecodeOps on the fast path

    def forward(self, x: Tensor, pos: Tensor, state: TalkerState, slots: Tensor,
                frame: "_FrameConstants") -> Tensor:
        """x [B, R, T, H] at positions pos [B, T] of the sessions in `slots` [B]; `frame` holds
        what every layer of this call shares (RoPE angles, the KV write indices)."""
        att = self.self_attn
        h = self.input_layernorm(x)
        if self.decode_ops is not None and x.shape[2] == 1:
            # engine's kernels: one qkv matmul, norms + RoPE + KV write, attention over [0, pos]
            a = self.decode_ops.talker_qkv_attention(self, h, pos, state, slots, frame)
        else:
            a = self._attention(h, pos, state, slots, frame)
        x, h = add_normed(x, att.o_proj(a), self.post_attention_layernorm, self.pre_feedforward_layernorm)
        return add_normed(x, self.mlp(h), self.post_feedforward_layernorm)[0]

    def _attention(self, h: Tensor, pos: Tensor, state: TalkerState, slots: Tensor,
                   frame: "_FrameConstants") -> Tensor:
        """The reference: normed input h [B, R, T, H] → attention output [B, R, T, Hq·D]."""
        cfg, att = self.cfg, self.self_attn
        b, r, t, _ = h.shape
        q = att.q_norm(att.q_proj(h).view(b, r, t, cfg.n_heads, cfg.head_dim))
        k = att.k_norm(att.k_proj(h).view(b, r, t, cfg.n_kv_heads, cfg.head_dim))
        v = att.v_proj(h).view(b, r, t, cfg.n_kv_heads, cfg.head_dim)
        rope = frame.rope[self.theta]
        q, k = apply_rope_tables(q, rope), apply_rope_tables(k, rope)
        # Write this chunk's rows first (index writes only: other slots untouched), then read
        # the slot's whole cache back, so a query sees the stored (e.g. bf16-rounded) keys.
        at = (frame.slot_idx, self.index, frame.row_idx, frame.head_idx, frame.pos_idx)
        state.k[at] = state.stored(k, self.index, 0)
        state.v[at] = state.stored(v, self.index, 1)
        keys = state.loaded(state.k[slots, self.index], self.index, 0, heads=2)   # [B, R, Hkv, P, D]
        values = state.loaded(state.v[slots, self.index], self.index, 1, heads=2)
        keys, values = keys.transpose(2, 3), values.transpose(2, 3)          # [B, R, P, Hkv, D]
        return attend(q, keys, values, pos, self.window, cfg.attn_scale)


class _FrameConstants:
    """Computed once per backbone call instead of once per layer: on the GPU each of these is
    a few kernel launches, and the talker's beat is launch-bound (28 layers). Each is made on
    first use: the engine's decode path reads only `cos_sin`, the reference path the rest."""

    def __init__(self, cfg: TalkerConfig, pos: Tensor, slots: Tensor, rows: int):
        self._cfg, self._pos, self._slots, self._rows = cfg, pos, slots, rows
        self._thetas = (cfg.rope_theta_full, cfg.rope_theta_local)

    @functools.cached_property
    def cos_sin(self) -> dict[float, tuple[Tensor, Tensor]]:
        """θ → rope_cos_sin [B, 1, T, D/2]."""
        return {th: rope_cos_sin(self._pos[:, None], self._cfg.head_dim, th) for th in self._thetas}

    @functools.cached_property
    def rope(self) -> dict[float, tuple[Tensor, Tensor]]:
        """θ → rope_tables [B, 1, T, 1, D]."""
        return {th: rope_tables(*self.cos_sin[th]) for th in self._thetas}

    # KV write indices, broadcast to [B, R, T, Hkv]
    @functools.cached_property
    def slot_idx(self) -> Tensor:
        return self._slots[:, None, None, None]

    @functools.cached_property
    def row_idx(self) -> Tensor:
        return torch.arange(self._rows, device=self._pos.device)[None, :, None, None]

    @functools.cached_property
    def head_idx(self) -> Tensor:
        return torch.arange(self._cfg.n_kv_heads, device=self._pos.device)[None, None, None, :]

    @functools.cached_property
    def pos_idx(self) -> Tensor:
        return self._pos[:, None, :, None]


class Backbone(nn.Module):
    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)

    def forward(self, x: Tensor, pos: Tensor, state: TalkerState, slots: Tensor) -> Tensor:
        frame = _FrameConstants(self.cfg, pos, slots, x.shape[1])
        for layer in self.layers:
            x = layer(x, pos, state, slots, frame)
        return self.norm(x)


# ------------------------------------------------------------------------- fusion and model

class GatedFusion(nn.Module):
    """F(a, t) = final_norm(σ(rs)·(σ(g)⊙audio_proj(a/Q) + (1−σ(g))⊙text_proj(t)))."""

    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.n_codebooks = cfg.n_codebooks
        self.audio_proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.text_proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.gate = nn.Parameter(torch.zeros(cfg.hidden))
        self.residual_scale = nn.Parameter(torch.zeros(()))
        self.final_norm = RMSNorm(cfg.hidden, cfg.rms_eps)

    def forward(self, audio: Tensor, text: Tensor) -> Tensor:
        g = torch.sigmoid(self.gate)
        mixed = g * self.audio_proj(audio / self.n_codebooks) + (1 - g) * self.text_proj(text)
        return self.final_norm(torch.sigmoid(self.residual_scale) * mixed)


class EarTTS(nn.Module):
    """`tts_model.tts_model`: the network; the Talker around it holds the prompt buffers."""

    def __init__(self, cfg: TalkerConfig, char_table: CharTable | None = None):
        super().__init__()
        self.cfg = cfg
        self.backbone = Backbone(cfg)
        self.embed_subword = SubwordEmbedding(cfg, char_table)
        self.embed_code = nn.Linear(cfg.latent, cfg.hidden, bias=False)
        self.rvq_embs = nn.Parameter(torch.empty(cfg.n_codebooks, cfg.codebook_size, cfg.latent))
        self.bos_emb = nn.Parameter(torch.empty(cfg.hidden))
        self.null_emb = nn.Parameter(torch.empty(cfg.hidden))
        # Projects a codec-encoded speaker prompt; unused: the Aria prompt comes pre-projected.
        self.audio_prompt_projection_W = nn.Parameter(torch.empty(cfg.hidden, cfg.hidden))
        self.gated_fusion_audio_text = GatedFusion(cfg)
        self.mog_head = MogHead(cfg)
        # ‖e‖² of every code vector [Q, V]: weights only, so made at load (`derive_tables`)
        self.register_buffer("rvq_sqnorms", torch.empty(cfg.n_codebooks, cfg.codebook_size),
                             persistent=False)

    @torch.no_grad()
    def derive_tables(self) -> None:
        self.rvq_sqnorms = codebook_sqnorms(self.rvq_embs)

    def audio_embedding(self, codes: Tensor) -> Tensor:
        """codes int [..., Q] → embed_code(Σ_q rvq_embs[q][c_q]) [..., H]; c ≥ V adds zero."""
        cfg = self.cfg
        book = torch.arange(cfg.n_codebooks, device=codes.device)
        vecs = self.rvq_embs[book, codes.clamp(0, cfg.codebook_size - 1)]      # [..., Q, D]
        vecs = vecs * (codes < cfg.codebook_size)[..., None]
        return self.embed_code(vecs.sum(-2))

    def fuse(self, audio: Tensor, text: Tensor, rows: int) -> Tensor:
        """[..., H] audio and text → [..., R, H]: row c = F(a, t), row u = F(a, null_emb)."""
        fusion = self.gated_fusion_audio_text
        out = [fusion(audio, text)]
        if rows == 2:
            out.append(fusion(audio, self.null_emb.expand_as(text)))
        return torch.stack(out, dim=-2)


class _PromptLatents(nn.Module):          # checkpoint path `tts_model.audio_prompt_latents.*`
    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.register_buffer("Aria", torch.empty(1, cfg.n_warmup, cfg.hidden))


class Talker(nn.Module):
    """`tts_model.*` minus the codec: EAR-TTS plus silence codes, control codes, Aria prompt.

    Build on any device (`with torch.device("meta"): Talker(cfg)`), then `load_talker`
    (talker/weights.py) with the checkpoint names. `step` and `warmup` mutate `state` only by
    index writes at `slots`; they never synchronise with the host.
    """

    def __init__(self, cfg: TalkerConfig, char_table: CharTable | None = None):
        super().__init__()
        self.cfg = cfg
        self.tts_model = EarTTS(cfg, char_table)
        self.audio_prompt_latents = _PromptLatents(cfg)
        self.register_buffer("codec_silence_tokens", torch.zeros(cfg.n_codebooks, dtype=torch.int32))
        self.register_buffer("_control_codes", torch.tensor(cfg.control_codes, dtype=torch.int32))

    @torch.no_grad()
    def step(self, state: TalkerState, inputs: TalkerInputs, slots: Tensor) -> TalkerOutput:
        """One 80 ms frame for the B sessions at `slots` [B] (each at its own position)."""
        m = self.tts_model
        pos = state.position[slots]                                          # [B]
        ones = torch.ones(inputs.y.shape, device=inputs.y.device)
        text = m.embed_subword(inputs.y, ones)                               # [B, H]
        audio = m.audio_embedding(state.prev_codes[slots])                   # [B, H]
        x = m.fuse(audio, text, state.rows)[:, :, None]                      # [B, R, 1, H]
        h = m.backbone(x, pos[:, None], state, slots)[:, :, 0]               # [B, R, H]
        codes = m.mog_head.sample(h, m.embed_code, m.rvq_embs, inputs.uniforms, inputs.normals,
                                  m.rvq_sqnorms)
        prev, codec_codes = self.substitute(codes, inputs.y, inputs.idle)
        state.prev_codes[slots] = prev
        state.position[slots] = pos + 1
        return TalkerOutput(codes, codec_codes, h)

    def substitute(self, codes: Tensor, y: Tensor, idle: Tensor) -> tuple[Tensor, Tensor]:
        """(next prev codes, codec codes) from the generated codes [B, Q] (docs/MODEL.md §2.5 rules)."""
        silence = self.codec_silence_tokens.long()[None, :]
        pad_idle = (y == PAD) & idle
        prev = torch.where(((y == EOS) | pad_idle)[:, None], silence, codes)
        control = (codes >= self.cfg.codebook_size).any(dim=-1)
        return prev, torch.where((control | pad_idle)[:, None], silence, codes)

    @torch.no_grad()
    def kv_scales(self, rows: int) -> Tensor:
        """fp8 cache scales [L, 2, kv_heads] for these weights: the warm-up run once into an
        fp32 cache; each layer's and head's largest key and value, times KV8_HEADROOM (a call
        may go past what the warm-up shows), is mapped to e4m3's largest value."""
        cfg = self.cfg
        device = self.audio_prompt_latents.Aria.device
        one = TalkerState.alloc(cfg, 1, cfg.n_warmup, device,
                                "reference" if rows == 2 else "dense", kv_dtype=torch.float32)
        self.warmup(one, torch.zeros(1, dtype=torch.long, device=device), cfg.n_warmup)
        amax = torch.stack([one.k.abs().amax(dim=(0, 2, 4, 5)),
                            one.v.abs().amax(dim=(0, 2, 4, 5))], dim=1)       # [L, 2, kv]
        return (amax * KV8_HEADROOM / E4M3_MAX).clamp_min(1e-12)

    @torch.no_grad()
    def warmup(self, state: TalkerState, slots: Tensor, count: int) -> None:
        """Run the next `count` warm-up positions of each slot (its own position onwards; the
        caller keeps position + count ≤ n_warmup). Only the K/V rows are kept."""
        cfg, m = self.cfg, self.tts_model
        last = cfg.n_warmup - 1
        pos = state.position[slots][:, None] + torch.arange(count, device=slots.device)  # [B, T]
        is_last = pos == last
        sub_ids = torch.where(is_last, EOS, PAD)                       # text [PAD]*36 + [EOS]
        mask = (pos >= last - 1).float()                               # mask [0]*35 + [1, 1]
        text = m.embed_subword(sub_ids.flatten(), mask.flatten()).view(*pos.shape, cfg.hidden)
        aria = self.audio_prompt_latents.Aria[0][pos.clamp(max=last)]  # [B, T, H]
        bos_row = m.audio_embedding(self.codec_silence_tokens.long()) + m.bos_emb
        audio = torch.where(is_last[..., None], bos_row, aria)
        x = m.fuse(audio, text, state.rows).transpose(1, 2)            # [B, R, T, H]
        m.backbone(x, pos, state, slots)
        state.position[slots] = pos[:, -1] + 1
