"""Perception (docs/MODEL.md §2.2): cache-aware streaming FastConformer, one encoder frame per 80 ms.

Algorithm, per frame and session:
1. Subsampling of the 17-column mel window (9 cached + 8 new): conv0 3×3/2 → ReLU → 2×(depthwise
   3×3/2 → pointwise 1×1 → ReLU), each strided conv causally padded (2 before, 1 after) in time and
   frequency, so time 17→9→5→3 and frequency 128→65→33→17; the first 2 frames are dropped
   (`drop_extra_pre_encoded`) and `out` maps C·17 → d_model. On a session's first frame NeMo feeds
   one column alone; here the window's other columns are zero and every strided conv's input is
   zeroed before its last time step, which is exactly the zero padding the 1-column input gets.
2. 24 Conformer layers on that one row x: x += ½·FF1(LN x); u = LN_att(x); this frame's key and
   value (linear_k/v of u) go into row n mod 71 of the layer's K/V ring, which then holds the last
   71 frames; Transformer-XL scores ((q+u_bias)·k_i + (q+v_bias)·p_{d_i})/√dh with
   p_d = linear_pos(sinusoid(d)) at ring row i's distance d_i = (n − i) mod 71; rows older than
   the session's first frame are masked; x += out(softmax·V); conv module GLU(pw1) →
   depthwise k=9 over [time cache (8); g] → LN → SiLU → pw2; x += ½·FF2(LN x); x = LN_out(x).
3. e_t = x (RNNT input), a_t = proj(e_t) (thinker input).

The non-streaming path runs NeMo's offline computation over a whole utterance: the conv stack over
all columns and full attention with the causal 70-frame left mask, relative positions through
NeMo's pad-and-reshape `rel_shift` over 2T−1 positions. The two agree exactly except that NeMo's
streaming feeds zero mel columns (not padding) to encoder frame 1, which differs from offline only
when the subsampling biases are nonzero (random init has them 0, §8).

NeMo and TM cache the layer-normed attention inputs (70 rows) and recompute K/V over 71 rows every
frame; caching K/V is exact (§2.2), saves that recompute (7.2 GFLOP a session-frame) and, as a
ring, every cache shift: a frame writes one row per layer. The softmax sums its terms in ring
order, so results equal the shifted layout's up to float summation order.

A step takes up to `chunk_frames` consecutive frames of each session at once (the beat's two):
the frames are rows of one batch through every layer, each attending to its own 71 frames (the
chunk's later frames masked from the earlier ones) and the conv module running over [time cache;
the chunk's GLU outputs]. That is the same computation as one frame at a time, with each layer's
weights read and its kernels launched once per beat instead of once per frame: perception is
about a thousand small launches a frame, a fixed cost whatever the batch. The ring keeps
left_context + chunk_frames rows so that writing the chunk's rows evicts nothing its first frame
still attends to.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpu.model.perception_weights import NORMS, PREFIX, PerceptionConfig, param_shapes
from gpu.model.slots import fill_slots

def sinusoid(pos: Tensor, dim: int) -> Tensor:
    """NeMo PositionalEncoding rows for (possibly negative) positions: [..., dim], sin even / cos odd."""
    div = torch.exp(torch.arange(0, dim, 2, device=pos.device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    ang = pos.float()[..., None] * div
    return torch.stack([ang.sin(), ang.cos()], dim=-1).flatten(-2)


@dataclass
class StreamConstants:
    """What every layer's streaming attention shares in a step, made once per step rather than
    24 times (each is several kernel launches on the GPU). Frame n of a session writes its K/V
    into ring row n mod R (R = ring_rows); for a query at frame m, ring row i then holds the
    frame dist = (m − i) mod R back, visible when dist ≤ left_context and the frame is real.
    The reference's distance tables are made on first use: the engine's kernel derives them
    from `frames` itself, so on its path they would be launches on every beat for nothing."""
    write_at: tuple     # index of the step's rows in a layer's ring: → [B, H, F]
    frame: Tensor       # [B, F]: each query's frame
    frames: Tensor      # [B] long: the step's first frame per row
    left_context: int
    ring_rows: int

    @classmethod
    def of(cls, cfg: "PerceptionConfig", frames: Tensor, slots: Tensor, n_frames: int) -> "StreamConstants":
        R, dev = cfg.ring_rows, frames.device
        frame = frames[:, None] + torch.arange(n_frames, device=dev)                    # [B, F]
        write_at = (slots[:, None, None], torch.arange(cfg.n_heads, device=dev)[:, None],
                    torch.remainder(frame, R)[:, None, :])
        return cls(write_at, frame, frames, cfg.left_context, R)

    @functools.cached_property
    def _dist(self) -> Tensor:
        R = self.ring_rows
        return torch.remainder(self.frame[:, :, None] - torch.arange(R, device=self.frame.device), R)

    @functools.cached_property
    def pos_index(self) -> Tensor:
        """[B, F, R]: for ring row i, the row of `stream_pos` at its distance."""
        return self.ring_rows - 1 - self._dist

    @functools.cached_property
    def mask(self) -> Tensor:
        """[B, F, R]: ring row i is visible to the step's frame f."""
        return (self._dist <= self.left_context) & (self._dist <= self.frame[:, :, None])


@dataclass
class PerceptionState:
    """Per-slot caches. Invariant: after n frames, kv[l, s, f mod R] holds the attention keys and
    values of frame f for the last min(n, R) frames (R = ring_rows) (docs/MODEL.md §2.2: caching K/V instead of the
    layer-normed inputs is exact and saves their recompute over 71 rows every frame; a frame
    writes one row, nothing shifts), time[l, s] the last 8 GLU outputs."""
    k: Tensor       # [L, S, H, R, dh] compute dtype: keys, ring rows per head
    v: Tensor       # [L, S, H, R, dh] compute dtype: values
    time: Tensor    # [L, S, D, 8]  compute dtype
    frames: Tensor  # [S] long

    @classmethod
    def alloc(cls, cfg: PerceptionConfig, max_slots: int, device=None, dtype=torch.float32) -> "PerceptionState":
        L, D = cfg.n_layers, cfg.d_model
        ring = (L, max_slots, cfg.n_heads, cfg.ring_rows, cfg.head_dim)
        return cls(torch.zeros(ring, device=device, dtype=dtype),
                   torch.zeros(ring, device=device, dtype=dtype),
                   torch.zeros(L, max_slots, D, cfg.time_cache, device=device, dtype=dtype),
                   torch.zeros(max_slots, dtype=torch.long, device=device))

    def reset(self, slots: Tensor) -> None:
        for t in (self.k, self.v, self.time):
            fill_slots(t, slots, 0, dim=1)
        fill_slots(self.frames, slots, 0)


@dataclass
class PerceptionOutput:
    enc: Tensor     # e_t [B, d_model] (or [B, T, d_model]: a chunk's frames, or offline): RNNT input
    audio: Tensor   # a_t = proj(e_t) [B, out_dim] (or [B, T, out_dim]): thinker input

    def frame(self, f: int) -> "PerceptionOutput":
        return PerceptionOutput(self.enc[:, f], self.audio[:, f])


class PreEncode(nn.Module):
    """Causal dw-striding subsampling; `conv` indices 0, 2, 3, 5, 6 match the checkpoint."""

    def __init__(self, cfg: PerceptionConfig, **kw):
        super().__init__()
        C = cfg.sub_channels
        dw = lambda: nn.Conv2d(C, C, 3, stride=2, groups=C, **kw)
        pw = lambda: nn.Conv2d(C, C, 1, **kw)
        self.conv = nn.Sequential(nn.Conv2d(1, C, 3, stride=2, **kw), nn.ReLU(), dw(), pw(), nn.ReLU(), dw(), pw(), nn.ReLU())
        self.out = nn.Linear(C * cfg.sub_freq, cfg.d_model, **kw)

    def forward(self, mel: Tensor, first: Tensor | None = None) -> Tensor:
        """mel [B, T, M] → [B, T', d_model]. `first` [B] bool: keep only the last column (see top)."""
        x = self.conv_stack(mel, first)                                 # [B, C, T', 17]
        return self.out(x.transpose(1, 2).flatten(2))

    def conv_stack(self, mel: Tensor, first: Tensor | None = None) -> Tensor:
        """The three strided convs: [B, T, M] → [B, C, T', F']; output (t, f) sees inputs
        [8t − 14, 8t] × [8f − 14, 8f] (padding 2 before, 1 after, at each stage)."""
        x = mel.to(self.out.weight.dtype)[:, None]                      # [B, 1, T, M]
        for i in (0, 2, 5):                                             # the strided, padded convs
            if first is not None:   # zero all but the last time step of first-frame sessions
                keep = ~first[:, None] | (torch.arange(x.shape[2], device=x.device) == x.shape[2] - 1)
                x = x * keep[:, None, :, None].to(x.dtype)
            x = self.conv[i](F.pad(x, (2, 1, 2, 1)))                    # causal: 2 before, 1 after
            if i > 0:
                x = self.conv[i + 1](x)                                 # pointwise 1×1
            x = torch.relu(x)
        return x


class FeedForward(nn.Module):
    def __init__(self, cfg: PerceptionConfig, **kw):
        super().__init__()
        self.linear1 = nn.Linear(cfg.d_model, cfg.ff_dim, bias=cfg.use_bias, **kw)
        self.linear2 = nn.Linear(cfg.ff_dim, cfg.d_model, bias=cfg.use_bias, **kw)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(F.silu(self.linear1(x)))


class RelPosAttention(nn.Module):
    def __init__(self, cfg: PerceptionConfig, **kw):
        super().__init__()
        D, H = cfg.d_model, cfg.n_heads
        self.cfg = cfg
        for n in ("linear_q", "linear_k", "linear_v", "linear_out"):
            setattr(self, n, nn.Linear(D, D, bias=cfg.use_bias, **kw))
        self.linear_pos = nn.Linear(D, D, bias=False, **kw)
        self.pos_bias_u = nn.Parameter(torch.zeros(H, cfg.head_dim, **kw))
        self.pos_bias_v = nn.Parameter(torch.zeros(H, cfg.head_dim, **kw))
        # linear_pos of the streaming distances R−1 … 0 (R = ring_rows), [R, H, dh]: it depends
        # only on the weights, so `Perception.load_named` makes it once instead of every layer
        # every frame. Distances past left_context are never visible; a row for each ring
        # distance makes the ring-order gather a plain index (no clamp).
        self.register_buffer("stream_pos", torch.empty(cfg.ring_rows, H, cfg.head_dim, **kw),
                             persistent=False)
        self.decode_ops = None      # gpu.engine.decode_ops.TritonDecodeOps on the fast path

    @torch.no_grad()
    def derive_stream_pos(self) -> None:
        distances = torch.arange(self.cfg.ring_rows - 1, -1, -1, device=self.linear_pos.weight.device)
        table = sinusoid(distances, self.cfg.d_model).to(self.linear_pos.weight.dtype)
        self.stream_pos = self._heads(self.linear_pos, table)

    def _heads(self, lin: nn.Linear, x: Tensor) -> Tensor:
        return lin(x).unflatten(-1, (self.cfg.n_heads, self.cfg.head_dim))      # [B, T, H, dh]

    def _finish(self, scores: Tensor, mask: Tensor, v: Tensor) -> Tensor:
        """scores [B, H, Tq, Tk] (unscaled), mask [B|1, Tq, Tk] True = visible, v [B, Tk, H, dh]."""
        s = (scores.float() / math.sqrt(self.cfg.head_dim)).masked_fill(~mask[:, None], float("-inf"))
        o = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1).to(v.dtype), v)
        return self.linear_out(o.flatten(-2))

    def stream(self, u: Tensor, k_ring: Tensor, v_ring: Tensor, slots: Tensor,
               frame: "StreamConstants") -> Tensor:
        """u [B, F, D] the step's normed inputs; k_ring, v_ring [S, H, R, dh] this layer's K and
        V rings (head-major, so the score and value products read them without a copy; the
        step's rows are written at `slots` in place); `frame` the tables the layers share.
        With `decode_ops` set, q, k and v are one matmul (`perception_qkv`) and everything
        between the ring writes and linear_out is its `perception_attention`
        (gpu/kernels/relpos_attention.py: no ring gather, one launch)."""
        dh = self.cfg.head_dim
        if self.decode_ops is not None:
            q, k, v = self.decode_ops.perception_qkv(self, u)                   # [B, F, H, dh]
        else:
            q, k, v = (self._heads(lin, u) for lin in (self.linear_q, self.linear_k, self.linear_v))
        k_ring[frame.write_at] = k.transpose(1, 2).to(k_ring.dtype)
        v_ring[frame.write_at] = v.transpose(1, 2).to(v_ring.dtype)
        if self.decode_ops is not None:     # engine: one kernel reading the rings in place
            o = self.decode_ops.perception_attention(self, q, k_ring, v_ring, slots, frame.frames)
            return self.linear_out(o.flatten(2))
        k, v = k_ring.index_select(0, slots), v_ring.index_select(0, slots)     # [B, H, R, dh]
        q = q.transpose(1, 2)                                                   # [B, H, F, dh]
        p = self.stream_pos                                                     # [R, H, dh]
        ac = (q + self.pos_bias_u[:, None]) @ k.transpose(-1, -2)               # [B, H, F, R]
        bd = torch.einsum("bhqd,khd->bhqk", q + self.pos_bias_v[:, None], p)   # distance order
        bd = bd.gather(-1, frame.pos_index[:, None].expand(*ac.shape))         # → ring order
        s = ((ac + bd).float() / math.sqrt(dh)).masked_fill(~frame.mask[:, None], float("-inf"))
        o = s.softmax(-1).to(v.dtype) @ v                                        # [B, H, F, dh]
        return self.linear_out(o.transpose(1, 2).flatten(2))

    def full(self, u: Tensor) -> Tensor:
        """Offline over u [B, T, D]: NeMo's rel_shift over positions T−1 … −(T−1), causal left mask."""
        B, T, _ = u.shape
        q, k, v = self._heads(self.linear_q, u), self._heads(self.linear_k, u), self._heads(self.linear_v, u)
        pos = torch.arange(T - 1, -T, -1, device=u.device)                      # 2T − 1 positions
        p = self._heads(self.linear_pos, sinusoid(pos, self.cfg.d_model).to(u.dtype))
        ac = torch.einsum("bqhd,bkhd->bhqk", q + self.pos_bias_u, k)
        bd = torch.einsum("bqhd,phd->bhqp", q + self.pos_bias_v, p)             # [B, H, T, 2T−1]
        bd = F.pad(bd, (1, 0)).view(B, -1, 2 * T, T)[:, :, 1:].reshape(B, -1, T, 2 * T - 1)[..., :T]
        d = torch.arange(T, device=u.device)[:, None] - torch.arange(T, device=u.device)
        return self._finish(ac + bd, ((d >= 0) & (d <= self.cfg.left_context))[None], v)


class ConvModule(nn.Module):
    def __init__(self, cfg: PerceptionConfig, **kw):
        super().__init__()
        D, b = cfg.d_model, cfg.use_bias
        self.pointwise_conv1 = nn.Conv1d(D, 2 * D, 1, bias=b, **kw)
        self.depthwise_conv = nn.Conv1d(D, D, cfg.conv_kernel, groups=D, bias=b, **kw)
        self.batch_norm = nn.LayerNorm(D, eps=cfg.eps, **kw)     # conv_norm_type=layer_norm
        self.pointwise_conv2 = nn.Conv1d(D, D, 1, bias=b, **kw)

    def _tail(self, y: Tensor) -> Tensor:
        """depthwise output [B, D, T] → LN → SiLU → pw2 → [B, T, D]."""
        y = F.silu(self.batch_norm(y.transpose(1, 2)))
        return self.pointwise_conv2(y.transpose(1, 2)).transpose(1, 2)

    def stream(self, x: Tensor, tcache: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, F, D] normed, tcache [B, D, 8] → ([B, F, D], the cache after the F frames).
        The 1×1 convs run as matmuls on the rows as they lie: as convs over a 2-column [B, D, F]
        input they get an unaligned GEMM, a large share of perception's time."""
        pw1, pw2 = self.pointwise_conv1, self.pointwise_conv2
        g = F.glu(F.linear(x, pw1.weight[..., 0], pw1.bias), dim=-1)            # [B, F, D]
        seq = torch.cat([tcache, g.transpose(1, 2)], dim=2)                      # [B, D, 8 + F]
        y = F.silu(self.batch_norm(self.depthwise_conv(seq).transpose(1, 2)))   # [B, F, D]
        return F.linear(y, pw2.weight[..., 0], pw2.bias), seq[:, :, x.shape[1]:]

    def full(self, x: Tensor) -> Tensor:
        g = F.glu(self.pointwise_conv1(x.transpose(1, 2)), dim=1)              # [B, D, T]
        return self._tail(self.depthwise_conv(F.pad(g, (self.depthwise_conv.kernel_size[0] - 1, 0))))


class ConformerLayer(nn.Module):
    def __init__(self, cfg: PerceptionConfig, **kw):
        super().__init__()
        for n in NORMS:
            setattr(self, n, nn.LayerNorm(cfg.d_model, eps=cfg.eps, **kw))
        self.feed_forward1, self.feed_forward2 = FeedForward(cfg, **kw), FeedForward(cfg, **kw)
        self.self_attn, self.conv = RelPosAttention(cfg, **kw), ConvModule(cfg, **kw)
        self.decode_ops = None      # gpu.engine.decode_ops.TritonDecodeOps on the fast path

    def _add_norm(self, x: Tensor, y: Tensor, alpha: float, norm: nn.LayerNorm,
                  norm2: nn.LayerNorm | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """(s = x + alpha·y, the new residual; norm(s); norm2 of that or None). One launch with
        `decode_ops` set (gpu/kernels/layer_norm.py) instead of 2-3. The half-step residuals are
        one add with alpha = 0.5 (bit-equal to x + 0.5·y: the halving is exact)."""
        if self.decode_ops is not None:
            return self.decode_ops.perception_add_norm(x, y, alpha, norm, norm2)
        x = torch.add(x, y, alpha=alpha)
        u = norm(x)
        return x, u, None if norm2 is None else norm2(u)

    def stream(self, x: Tensor, h: Tensor, k_ring: Tensor, v_ring: Tensor, slots: Tensor,
               tcache: Tensor, frame: "StreamConstants", next_norm: nn.LayerNorm | None = None
               ) -> tuple[Tensor, Tensor | None, Tensor]:
        """x [B, F, D] and h = norm_feed_forward1(x) → (the output x; next_norm(x) or None, the
        next layer's h; tcache [B, D, 8] for the next step); writes the step's K/V rows of the
        sessions at `slots` into this layer's rings [S, H, R, dh]. h is made by the layer before
        because on the engine path its last add, norm_out and next_norm are one launch."""
        x, u, _ = self._add_norm(x, self.feed_forward1(h), 0.5, self.norm_self_att)
        x, u, _ = self._add_norm(x, self.self_attn.stream(u, k_ring, v_ring, slots, frame), 1.0,
                                 self.norm_conv)
        conv, tcache = self.conv.stream(u, tcache)
        x, u, _ = self._add_norm(x, conv, 1.0, self.norm_feed_forward2)
        _, x, h = self._add_norm(x, self.feed_forward2(u), 0.5, self.norm_out, next_norm)
        return x, h, tcache

    def full(self, x: Tensor) -> Tensor:
        x = torch.add(x, self.feed_forward1(self.norm_feed_forward1(x)), alpha=0.5)
        x = x + self.self_attn.full(self.norm_self_att(x))
        x = x + self.conv.full(self.norm_conv(x))
        x = torch.add(x, self.feed_forward2(self.norm_feed_forward2(x)), alpha=0.5)
        return self.norm_out(x)


class Perception(nn.Module):
    """state_dict keys = param_shapes names minus PREFIX (the featurizer lives in mel.py)."""

    def __init__(self, cfg: PerceptionConfig, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.cfg = cfg
        self.encoder = nn.Module()
        self.encoder.pre_encode = PreEncode(cfg, **kw)
        self.encoder.layers = nn.ModuleList(ConformerLayer(cfg, **kw) for _ in range(cfg.n_layers))
        self.proj = nn.Linear(cfg.d_model, cfg.out_dim, **kw)

    def load_named(self, tensors: dict[str, Tensor]) -> None:
        dtype = self.proj.weight.dtype
        self.load_state_dict({k[len(PREFIX):]: tensors[k].to(dtype) for k in param_shapes(self.cfg)},
                             strict=True, assign=True)
        for layer in self.encoder.layers:
            layer.self_attn.derive_stream_pos()

    @torch.no_grad()
    def step(self, state: PerceptionState, window: Tensor, slots: Tensor) -> PerceptionOutput:
        """One frame for B sessions: window [B, 17, mel_bins] (MelOutput.window) → [B, ·] outputs.
        Reads and writes rows `slots` of state; other rows untouched."""
        return self.step_frames(state, window[:, None], slots).frame(0)

    @torch.no_grad()
    def step_frames(self, state: PerceptionState, windows: Tensor, slots: Tensor) -> PerceptionOutput:
        """F ≤ chunk_frames consecutive frames for B sessions at once: windows [B, F, 17,
        mel_bins] (each frame's MelOutput.window) → [B, F, ·] outputs, as F single steps give."""
        B, n = windows.shape[:2]
        if n > self.cfg.chunk_frames:
            raise ValueError(f"{n} frames in one step; the ring holds chunks of {self.cfg.chunk_frames}")
        frames = state.frames[slots]
        first = (frames[:, None] + torch.arange(n, device=frames.device)) == 0
        x = self.encoder.pre_encode(windows.flatten(0, 1), first=first.flatten())[:, -1]
        x = x.unflatten(0, (B, n))                                              # [B, F, D]: the kept frames
        frame = StreamConstants.of(self.cfg, frames, slots, n)
        # index_select / index_copy_: plain row copies (advanced indexing's generic gather reaches
        # a small fraction of the bandwidth on the per-slot caches)
        tcache = state.time.index_select(1, slots)                              # [L, B, D, 8]
        new_time, layers = [], self.encoder.layers
        h = layers[0].norm_feed_forward1(x)
        for i, layer in enumerate(layers):
            after = layers[i + 1].norm_feed_forward1 if i + 1 < len(layers) else None
            x, h, t = layer.stream(x, h, state.k[i], state.v[i], slots, tcache[i], frame, after)
            new_time.append(t)
        state.time.index_copy_(1, slots, torch.stack(new_time))
        state.frames[slots] = frames + n
        return PerceptionOutput(x, self.proj(x))

    @torch.no_grad()
    def forward_utterance(self, mel: Tensor) -> PerceptionOutput:
        """Offline: every centred mel column [B, N, mel_bins] → encoder frames [B, subsampled_len(N), ·]."""
        x = self.encoder.pre_encode(mel)
        for layer in self.encoder.layers:
            x = layer.full(x)
        return PerceptionOutput(x, self.proj(x))
