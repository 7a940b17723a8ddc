"""Thinker (docs/MODEL.md §2.4): NemotronH (Nano-9B-v2 layout), one position per 80 ms frame.

Algorithm, per position: x = 1·E[y_{t−1}] + 1·a_t + 2·E[f_{t−1}]; 56 pre-norm residual blocks
h ← h + Mixer(RMSNorm(h)) with the mixer given by the pattern letter (M Mamba2, - MLP relu², *
attention); h ← norm_f(h); y_t = argmax lm_head(h), f_t = argmax function_head(h).
- Mamba2: [z | xBC | dt] = in_proj(u); xBC ← SiLU(causal depthwise conv k=4 + bias) over the 3
  cached columns; x [128×80], B, C [8×128]; Δ = softplus(dt + dt_bias), A = −exp(A_log); head n of
  group n//16: S_n ← exp(Δ_n A_n)·S_n + Δ_n x_n B_gᵀ (fp32), y_n = S_n C_g + D_n x_n; y ← group
  RMSNorm (groups of 1280) of y·silu(z); out_proj.
- Attention: 40 q / 8 kv heads × 128, no RoPE; q head j reads kv head j//5; scale 1/√128.

The stateful path handles a chunk of C positions per session (`step` is C = 1, `prefill` runs the
system prompt in bounded chunks): Mamba scans the chunk position by position and attention writes
the chunk's K/V at the session's own length before attending, with a per-session count of valid
positions so desynchronised sessions share a batch. Masked positions leave every state untouched;
their K/V go to a trash row past the cache. `forward_sequence` is the plain non-streaming model
(Mamba2 in its quadratic "SSD" dual form, SDPA causal attention) that the tests check it against.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from wave_actors.core.text import PAD
from gpu.model.formats import store_ssm
from gpu.model.slots import fill_slots, roll_blocks
from gpu.model.thinker_weights import PREFIX, ThinkerConfig, param_shapes

def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x·rsqrt(mean(x²) + eps)·w over the last dim, computed in fp32, returned in x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class RMSNorm(nn.Module):
    fused = None        # the engine's one-launch kernel of `rms_norm` (decode_ops.install)

    def __init__(self, dim: int, eps: float, **kw):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim, **kw))

    def forward(self, x: Tensor) -> Tensor:
        if self.fused is not None and x.dtype == self.weight.dtype:
            return self.fused(x, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps)


@dataclass
class ThinkerState:
    """Per-slot state. Invariant: a session that has run n positions has length n, K/V rows [0, n)
    written, and Mamba states after n positions. length ≤ max_positions is the caller's to keep."""
    ssm: Tensor     # [n_mamba, S, heads, head_dim, d_state] the profile's SSM dtype
    conv: Tensor    # [n_mamba, S, conv_dim, k−1] compute dtype: last 3 pre-conv xBC columns
    k: Tensor       # [n_attn, S, max_positions + 1, kv_heads, head_dim]; the last row is trash
    v: Tensor       # same
    length: Tensor  # [S] long, positions in the KV cache
    ssm_round: str = "nearest"      # a bf16 SSM state's rounding (Profile.ssm_round)

    @classmethod
    def alloc(cls, cfg: ThinkerConfig, max_slots: int, max_positions: int, device=None,
              dtype=torch.float32, ssm_dtype=torch.float32,
              ssm_round: str = "nearest") -> "ThinkerState":
        nm, na = cfg.pattern.count("M"), cfg.pattern.count("*")
        kv = (na, max_slots, max_positions + 1, cfg.kv_heads, cfg.head_dim)
        return cls(torch.zeros(nm, max_slots, cfg.mamba_heads, cfg.mamba_head_dim, cfg.d_state,
                               device=device, dtype=ssm_dtype),
                   torch.zeros(nm, max_slots, cfg.conv_dim, cfg.conv_kernel - 1, device=device, dtype=dtype),
                   torch.zeros(kv, device=device, dtype=dtype), torch.zeros(kv, device=device, dtype=dtype),
                   torch.zeros(max_slots, dtype=torch.long, device=device), ssm_round)

    @property
    def max_positions(self) -> int:
        return self.k.shape[2] - 1

    def reset(self, slots: Tensor) -> None:
        """Zero the Mamba states and empty the KV cache (rows beyond length are never read)."""
        fill_slots(self.ssm, slots, 0, dim=1)
        fill_slots(self.conv, slots, 0, dim=1)
        fill_slots(self.length, slots, 0)

    def roll(self, slot: int, sink: int, drop: int) -> None:
        """Slot `slot`'s `drop` oldest positions after its first `sink` (its system prompt) leave
        the KV cache: the later rows move down and its length shrinks by `drop`. Attention here
        has no positional encoding (the Mamba layers carry order), so the moved rows need no
        other change; the Mamba states carry on as they are. Every row up to the cache's size
        moves (the caller rolls a session near its end): nothing is read back to the host, so
        a roll queued behind a running beat does not wait for it."""
        cap = self.max_positions
        if sink + drop > cap:
            raise ValueError(f"cannot drop {drop} positions after {sink} sinks of {cap}")
        for a, b in roll_blocks(sink, cap - drop, self.k[:, slot, 0].numel() * 2 * 4, drop):
            for cache in (self.k, self.v):
                cache[:, slot, a:b] = cache[:, slot, a + drop:b + drop]
        self.length[slot] -= drop


class Mamba2(nn.Module):
    def __init__(self, cfg: ThinkerConfig, **kw):
        super().__init__()
        self.cfg = cfg
        nh = cfg.mamba_heads
        self.in_proj = nn.Linear(cfg.hidden, cfg.in_proj_dim, bias=False, **kw)
        self.conv1d = nn.Conv1d(cfg.conv_dim, cfg.conv_dim, cfg.conv_kernel, groups=cfg.conv_dim, **kw)
        self.dt_bias, self.A_log, self.D = (nn.Parameter(torch.zeros(nh, **kw)) for _ in range(3))
        self.norm = RMSNorm(cfg.d_inner, cfg.eps, **kw)      # holds the weight; applied per group in _out
        self.out_proj = nn.Linear(cfg.d_inner, cfg.hidden, bias=False, **kw)

    def _split(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        c = self.cfg
        return self.in_proj(u).split([c.d_inner, c.conv_dim, c.mamba_heads], dim=-1)   # z, xBC, dt

    def _ssm_inputs(self, xbc: Tensor, dt: Tensor):
        """Post-conv xBC [B, T, conv_dim], dt [B, T, heads] → fp32 x [B,T,h,p], B, C [B,T,h,n]
        (each head's group row), Δ [B, T, h], A [h]."""
        c = self.cfg
        x, Bm, Cm = xbc.float().split([c.d_inner, c.n_groups * c.d_state, c.n_groups * c.d_state], dim=-1)
        per_group = c.mamba_heads // c.n_groups
        heads = lambda t: t.unflatten(-1, (c.n_groups, c.d_state)).repeat_interleave(per_group, dim=-2)
        delta = F.softplus(dt.float() + self.dt_bias.float())
        return x.unflatten(-1, (c.mamba_heads, c.mamba_head_dim)), heads(Bm), heads(Cm), delta, -torch.exp(self.A_log.float())

    def _out(self, y: Tensor, x: Tensor, z: Tensor) -> Tensor:
        """y [B,T,h,p] fp32 (S·C) → + D·x → gated group RMSNorm with z → out_proj."""
        y = (y + self.D.float()[:, None] * x).flatten(-2)
        g = (y * F.silu(z.float())).unflatten(-1, (self.cfg.n_groups, self.cfg.group_size))
        g = (g * torch.rsqrt(g.square().mean(-1, keepdim=True) + self.cfg.eps)).flatten(-2)
        return self.out_proj(g.to(z.dtype) * self.norm.weight)

    @staticmethod
    def _ssd(x: Tensor, Bh: Tensor, Ch: Tensor, delta: Tensor, A: Tensor,
             ssm: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Mamba2's dual (SSD) form over T positions from the state `ssm` [B, h, p, n] (None:
        zero): with a_t = Δ_t A, h_t = exp(Σ_{r≤t} a_r)·h_0 + Σ_{s≤t} exp(Σ_{r=s+1..t} a_r)·Δ_s
        x_s ⊗ B_s and y_t = h_t·C_t. Returns (y [B, T, h, p] before D and the gate, h_{T−1}).
        The decays are sums over segments, not differences of running sums, which would lose
        the small exponents next to large ones."""
        T = x.shape[1]
        a = (delta * A).transpose(1, 2)                                             # [B, h, T]
        seg = a[..., :, None].expand(-1, -1, -1, T)                                 # [B, h, t, s] = a_t
        tri = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        seg = seg.masked_fill(~tri.tril(-1), 0.0).cumsum(-2)                        # Σ_{r=s+1..t} a_r
        decay = seg.exp().masked_fill(~tri, 0.0)                                    # [B, h, t, s]
        dx = delta[..., None] * x                                                   # [B, T, h, p]
        y = torch.einsum("bhts,bshp->bthp", decay * torch.einsum("bthn,bshn->bhts", Ch, Bh), dx)
        last = torch.einsum("bshp,bshn->bhpn", decay[:, :, -1].transpose(1, 2)[..., None] * dx, Bh)
        if ssm is None:
            return y, last
        carried = a.cumsum(-1).exp()                                                # [B, h, T]
        ssm = ssm.float()                               # stored in bf16 or fp32, used in fp32
        y = y + torch.einsum("bhpn,bthn->bthp", ssm, Ch) * carried.transpose(1, 2)[..., None]
        return y, ssm * carried[..., -1, None, None] + last

    def forward_chunk(self, u: Tensor, conv: Tensor, ssm: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """u [B, C, H]; conv [B, conv_dim, 3]; ssm [B, h, p, n] (fp32 returned); valid [B, C] (a
        prefix of each row). Returns y [B, C, H] and the states after the valid positions.

        The scan runs in the dual form from the carried state (`_ssd`): it reads the [h, p, n]
        state a few times per chunk instead of several times per position (a start row's prompt
        chunk is state-bandwidth bound). Invalid positions get Δ = 0: no decay, no input, so the
        state after the chunk is the state after its valid prefix."""
        z, xbc, dt = self._split(u)
        seq = torch.cat([conv, xbc.transpose(1, 2)], dim=2)                        # [B, conv_dim, 3 + C]
        xbc = F.silu(self.conv1d(seq)).transpose(1, 2)                             # [B, C, conv_dim]
        n_valid = valid.sum(1)
        keep = n_valid[:, None, None] + torch.arange(conv.shape[2], device=u.device)   # last 3 valid columns
        conv = seq.gather(2, keep.expand(-1, seq.shape[1], -1))
        x, Bh, Ch, delta, A = self._ssm_inputs(xbc, dt)
        y, ssm = self._ssd(x, Bh, Ch, delta * valid[..., None], A, ssm)
        return self._out(y, x, z), conv, ssm

    def forward_sequence(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Non-streaming from a zero state, u [B, T, H] → (y, conv state, ssm state)."""
        z, xbc_raw, dt = self._split(u)
        k = self.cfg.conv_kernel
        padded = F.pad(xbc_raw.transpose(1, 2), (k - 1, 0))
        xbc = F.silu(self.conv1d(padded)).transpose(1, 2)
        x, Bh, Ch, delta, A = self._ssm_inputs(xbc, dt)
        y, ssm = self._ssd(x, Bh, Ch, delta, A)
        return self._out(y, x, z), padded[:, :, -(k - 1):], ssm


class Attention(nn.Module):
    def __init__(self, cfg: ThinkerConfig, **kw):
        super().__init__()
        self.cfg = cfg
        q, kv = cfg.attn_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, q, bias=False, **kw)
        self.k_proj = nn.Linear(cfg.hidden, kv, bias=False, **kw)
        self.v_proj = nn.Linear(cfg.hidden, kv, bias=False, **kw)
        self.o_proj = nn.Linear(q, cfg.hidden, bias=False, **kw)

    def _qkv(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        c = self.cfg
        return (self.q_proj(u).unflatten(-1, (c.attn_heads, c.head_dim)),
                self.k_proj(u).unflatten(-1, (c.kv_heads, c.head_dim)), self.v_proj(u).unflatten(-1, (c.kv_heads, c.head_dim)))

    def forward_chunk(self, u: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, length: Tensor,
                      valid: Tensor) -> Tensor:
        """u [B, C, H]; k/v_cache the whole [S, max_pos + 1, kv, dh] layer tensors, written in place
        at rows length + i of `slots` for valid i (the trash row otherwise); length [B] before."""
        c, C = self.cfg, u.shape[1]
        q, k, v = self._qkv(u)
        pos = length[:, None] + torch.arange(C, device=u.device)                   # [B, C]
        trash = k_cache.shape[1] - 1
        write = torch.where(valid & (pos < trash), pos, trash)
        k_cache[slots[:, None], write] = k
        v_cache[slots[:, None], write] = v
        keys, vals = k_cache[slots], v_cache[slots]                                 # [B, max_pos + 1, kv, dh]
        group = c.attn_heads // c.kv_heads
        keys, vals = keys.repeat_interleave(group, dim=2), vals.repeat_interleave(group, dim=2)
        s = torch.einsum("bqhd,bkhd->bhqk", q, keys).float() / math.sqrt(c.head_dim)
        idx = torch.arange(keys.shape[1], device=u.device)
        mask = (idx <= pos[:, :, None]) & (idx < trash)                             # [B, C, max_pos + 1]
        p = s.masked_fill(~mask[:, None], float("-inf")).softmax(-1).to(vals.dtype)
        return self.o_proj(torch.einsum("bhqk,bkhd->bqhd", p, vals).flatten(-2))

    def forward_sequence(self, u: Tensor) -> Tensor:
        """Non-streaming full causal attention over u [B, T, H] (SDPA, kv heads repeated)."""
        q, k, v = self._qkv(u)
        group = self.cfg.attn_heads // self.cfg.kv_heads
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.o_proj(o.transpose(1, 2).flatten(-2))


class MLP(nn.Module):
    def __init__(self, cfg: ThinkerConfig, **kw):
        super().__init__()
        self.up_proj = nn.Linear(cfg.hidden, cfg.mlp_dim, bias=False, **kw)
        self.down_proj = nn.Linear(cfg.mlp_dim, cfg.hidden, bias=False, **kw)

    def forward(self, u: Tensor) -> Tensor:
        return self.down_proj(torch.relu(self.up_proj(u)).square())


class Block(nn.Module):
    def __init__(self, cfg: ThinkerConfig, kind: str, **kw):
        super().__init__()
        self.kind = kind
        self.norm = RMSNorm(cfg.hidden, cfg.eps, **kw)
        self.mixer = {"M": Mamba2, "-": MLP, "*": Attention}[kind](cfg, **kw)


@dataclass
class ThinkerOutput:
    text: Tensor         # [B] long, greedy y_t
    func: Tensor         # [B] long, greedy f_t
    text_logits: Tensor  # [B, vocab] fp32
    func_logits: Tensor  # [B, vocab] fp32


class Thinker(nn.Module):
    """state_dict keys = param_shapes names minus PREFIX."""

    def __init__(self, cfg: ThinkerConfig, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden, **kw)
        self.llm = nn.Module()
        self.llm.layers = nn.ModuleList(Block(cfg, kind, **kw) for kind in cfg.pattern)
        self.llm.norm_f = RMSNorm(cfg.hidden, cfg.eps, **kw)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False, **kw)
        self.function_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False, **kw)
        self.decode_ops = None      # gpu.engine.decode_ops.TritonDecodeOps on the fast path

    def load_named(self, tensors: dict[str, Tensor]) -> None:
        dtype = self.lm_head.weight.dtype
        self.load_state_dict({k[len(PREFIX):]: tensors[k].to(dtype) for k in param_shapes(self.cfg)},
                             strict=True, assign=True)

    def fuse(self, text: Tensor, user: Tensor, func: Tensor) -> Tensor:
        """x = w_text·E[text] + w_user·user + w_func·E[func]; user is a_t or E[prompt token]."""
        c, E = self.cfg, self.embed_tokens
        return c.text_weight * E(text) + c.user_weight * user.to(E.weight.dtype) + c.func_weight * E(func)

    def _run(self, state: ThinkerState, x: Tensor, n_valid: Tensor, slots: Tensor,
             decode: bool = False) -> Tensor:
        """x [B, C, H], n_valid [B] ≤ C → norm_f(h) [B, C, H]; advances rows `slots` of state.
        `decode` (one valid position per row) lets the engine's fused kernels (`decode_ops`,
        None in the reference) update the state in place instead of gather / compute / scatter."""
        length = state.length[slots]
        valid = torch.arange(x.shape[1], device=x.device) < n_valid[:, None]     # [B, C]
        ops = self.decode_ops if decode else None
        stochastic = state.ssm_round == "stochastic"
        h = x
        for block, j in zip(self.llm.layers, self.cfg.layer_slot):
            u = block.norm(h)
            if block.kind == "M" and ops is not None:
                y = ops.mamba(block.mixer, u, state.conv[j], state.ssm[j], slots,
                              (state.length, j) if stochastic else None)
            elif block.kind == "M":
                y, conv, ssm = block.mixer.forward_chunk(u, state.conv[j, slots], state.ssm[j, slots], valid)
                state.conv[j, slots] = conv
                state.ssm[j, slots] = store_ssm(ssm, state.ssm.dtype, state.ssm_round, length, j)
            elif block.kind == "*" and ops is not None:
                y = ops.thinker_attention(block.mixer, u, state.k[j], state.v[j], slots, length)
            elif block.kind == "*":
                y = block.mixer.forward_chunk(u, state.k[j], state.v[j], slots, length, valid)
            else:
                y = block.mixer(u)
            h = h + y
        state.length[slots] = length + n_valid
        return self.llm.norm_f(h)

    def heads(self, h: Tensor) -> ThinkerOutput:
        """Final hidden [B, H] → greedy text and function tokens (logits in fp32)."""
        lt, lf = self.lm_head(h).float(), self.function_head(h).float()
        return ThinkerOutput(lt.argmax(-1), lf.argmax(-1), lt, lf)

    @torch.no_grad()
    def step(self, state: ThinkerState, audio: Tensor, text_in: Tensor, func_in: Tensor, slots: Tensor) -> ThinkerOutput:
        """One frame for B sessions: audio a_t [B, H], text_in y_{t−1} [B], func_in f_{t−1} [B] (the
        engine feeds back y, f or forced function-response tokens). One position per session."""
        x = self.fuse(text_in, audio, func_in)[:, None]
        h = self._run(state, x, torch.ones_like(slots), slots, decode=True)
        return self.heads(h[:, 0])

    @torch.no_grad()
    def prefill(self, state: ThinkerState, tokens: Tensor, n_valid: Tensor, slots: Tensor) -> None:
        """One bounded chunk of system-prompt positions: tokens [B, C] ([bos] + prompt + [eos] split
        across calls), the first n_valid [B] of each row real. Text and function channels are PAD,
        the prompt token rides the user channel (TM: timeline token, use_audio_embed = 0)."""
        pad = torch.full_like(tokens, PAD)
        self._run(state, self.fuse(pad, self.embed_tokens(tokens), pad), n_valid, slots)

    @torch.no_grad()
    def forward_sequence(self, x: Tensor) -> Tensor:
        """Non-streaming over fused inputs x [B, T, H] from a fresh state → norm_f(h) [B, T, H]."""
        h = x
        for block in self.llm.layers:
            u = block.norm(h)
            if block.kind == "M":
                y = block.mixer.forward_sequence(u)[0]
            elif block.kind == "*":
                y = block.mixer.forward_sequence(u)
            else:
                y = block.mixer(u)
            h = h + y
        return self.llm.norm_f(h)
