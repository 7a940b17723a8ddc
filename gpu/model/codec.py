"""RVQ-VAE codec decoder (docs/MODEL.md §2.6): 31 codes per 80 ms frame → 1764 samples at 22 050 Hz.

Algorithm, per frame, for every session in the batch (caches slot-indexed):
  latent = Σ_q mus_list[q][c_q]                                        [512, 1]
  3 stages: bias-free ConvTranspose with kernel = stride (9, 7, 7: no overlap, so no cache)
            then 3 causal ConvNeXt blocks: depthwise k7 over [cache(6); x] (cache ← last 6
            inputs) → channel LayerNorm (eps 1e-6) → pwconv1 C→4C → exact GELU → pwconv2, + x
            lengths 1 → 9 → 63 → 441 spectra
  conv1x1 384→18: magnitude logits 0..8, phases 9..17; mag = 100·sigmoid(logit − ln 100);
            X = mag·(cos φ + i sin φ), imag 0 at bins 0 and 8
  ISTFT (n_fft 16, hop 4, periodic Hann w): [4 cached spectra; 441 new] → irfft → clamp to
            ±w[n] → ×w[n] → overlap-add → ÷Σw² → trim 6 + 8 per side → 1764 samples.
At stream end `flush` runs 2 zero spectra after the cache: the last 8 samples.
Everything is fp32; the non-streaming `decode_sequence` is the same network over a whole code
sequence (the streaming check in tests/test_model_tts_codec.py).
This is the reference, channels-first [B, C, T]. With a `decode_ops` hook set (the engine's
gpu/engine/decode_ops.py) `step` hands the network to it instead: the same function channels-last,
with the ConvNeXt caches updated in place by Triton kernels; both share `to_spectra`,
`stream_pcm` and `istft`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpu.model.talker.weights import load_named
from wave_actors.core.frames import OUT_RATE, SAMPLES_OUT
from gpu.model.slots import fill_slots

PREFIX = "tts_model.audio_codec."


@dataclass(frozen=True)
class CodecConfig:
    n_codebooks: int = 31
    codebook_size: int = 1024
    latent: int = 512
    base_channels: int = 384
    channel_mult: tuple[int, ...] = (4, 2, 1)        # stage channels 1536, 768, 384
    rates: tuple[int, ...] = (9, 7, 7)               # ConvT kernel = stride
    n_blocks: int = 3                                # ConvNeXt blocks per stage
    kernel: int = 7
    ln_eps: float = 1e-6
    n_fft: int = 16
    hop: int = 4
    max_magnitude: float = 100.0
    sample_rate: int = OUT_RATE

    @classmethod
    def full(cls) -> "CodecConfig":
        return cls()

    @classmethod
    def tiny(cls) -> "CodecConfig":
        # Narrow channels, same strides: still 441 spectra and 1764 samples per frame.
        return cls(n_codebooks=8, codebook_size=64, latent=32, base_channels=16)

    def __post_init__(self):
        if self.samples_per_frame != SAMPLES_OUT or self.sample_rate != OUT_RATE:
            raise ValueError(f"{self.samples_per_frame} samples per frame, the node needs {SAMPLES_OUT}")
        if self.n_fft % self.hop or (self.n_fft - self.hop) % 2:
            raise ValueError("n_fft must be a multiple of hop with an even overlap")

    @property
    def stage_channels(self) -> tuple[int, ...]:
        return tuple(self.base_channels * m for m in self.channel_mult)

    @property
    def block_channels(self) -> tuple[int, ...]:
        """Channels of the 9 ConvNeXt caches, in order."""
        return tuple(c for c in self.stage_channels for _ in range(self.n_blocks))

    @property
    def cache_width(self) -> int:
        return self.kernel - 1

    @property
    def spectra_per_frame(self) -> int:
        return math.prod(self.rates)

    @property
    def samples_per_frame(self) -> int:
        return self.spectra_per_frame * self.hop

    @property
    def n_bins(self) -> int:
        return self.n_fft // 2 + 1

    @property
    def istft_pad(self) -> int:              # centre padding of the ISTFT: (16 − 4)/2 = 6
        return (self.n_fft - self.hop) // 2

    @property
    def stream_trim(self) -> int:            # streaming trim per side: 2 hops = 8
        return 2 * self.hop

    @property
    def cache_spectra(self) -> int:
        """Spectra carried between frames (4): the overlap that makes each frame 441·hop long."""
        return (2 * (self.istft_pad + self.stream_trim) - self.n_fft + self.hop) // self.hop

    @property
    def flush_spectra(self) -> int:          # zero spectra appended at stream end (2)
        return self.stream_trim // self.hop


@dataclass
class CodecState:
    """Per-slot codec caches; leading dim max_slots. Zeros = a fresh stream."""
    conv: list[Tensor]   # 9 × fp32 [S, C_i, 6]: the last 6 inputs of each ConvNeXt block
    spec: Tensor         # fp32 [S, 2·bins, 4]: real (0..8) | imag (9..17) of the last 4 spectra

    @classmethod
    def alloc(cls, cfg: CodecConfig, max_slots: int, device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> "CodecState":
        """fp32 always in serving (bf16 collapses the codec); fp64 only for exactness checks."""
        new = dict(device=device, dtype=dtype)
        conv = [torch.zeros(max_slots, c, cfg.cache_width, **new) for c in cfg.block_channels]
        return cls(conv, torch.zeros(max_slots, 2 * cfg.n_bins, cfg.cache_spectra, **new))

    def reset(self, slots: Tensor) -> None:
        for cache in self.conv:
            fill_slots(cache, slots, 0)
        fill_slots(self.spec, slots, 0)


class ConvNeXtBlock(nn.Module):
    # The pointwise convs as row-major matmuls over [B·T, C] (`matmul`; default: on CUDA). As
    # 1×1 convs over [B, C, T] with T = 441, cuBLAS falls back to unaligned TF32 kernels, several
    # times slower. Same numbers up to fp32 rounding; the CPU keeps the conv, whose rounding does
    # not depend on the batch size.
    matmul: bool | None = None

    def __init__(self, channels: int, cfg: CodecConfig):
        super().__init__()
        self.dwconv = nn.Conv1d(channels, channels, cfg.kernel, groups=channels)
        self.norm = nn.LayerNorm(channels, eps=cfg.ln_eps)
        self.pwconv1 = nn.Conv1d(channels, 4 * channels, 1)
        self.pwconv2 = nn.Conv1d(4 * channels, channels, 1)

    def forward(self, x: Tensor, left: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, C, T] with its causal left context `left` [B, C, 6] → (y [B, C, T], new context)."""
        padded = torch.cat([left, x], dim=-1)
        h = F.conv1d(padded, self.dwconv.weight, self.dwconv.bias, groups=x.shape[1])  # [B, C, T]
        h = self.norm(h.transpose(1, 2))                                 # LayerNorm over channels
        if self.matmul if self.matmul is not None else x.is_cuda:
            h = F.linear(h, self.pwconv1.weight[..., 0], self.pwconv1.bias)          # [B, T, 4C]
            h = F.linear(F.gelu(h), self.pwconv2.weight[..., 0], self.pwconv2.bias)  # exact GELU
            h = h.transpose(1, 2)
        else:
            h = self.pwconv2(F.gelu(self.pwconv1(h.transpose(1, 2))))
        return x + h, padded[..., -left.shape[-1]:]


class Upsample(nn.Module):
    """Bias-free ConvTranspose1d with kernel = stride: no overlap, so each input sample becomes
    k output samples independently. Computed as a pointwise conv to k·C_out channels (same
    numbers; unlike ConvT/linear on CPU its rounding does not depend on the batch size)."""

    def __init__(self, c_in: int, c_out: int, rate: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c_in, c_out, rate))     # ConvTranspose1d layout

    def forward(self, x: Tensor) -> Tensor:
        c_in, c_out, k = self.weight.shape
        b, _, t = x.shape
        w = self.weight.permute(1, 2, 0).reshape(c_out * k, c_in, 1)    # channel o·k + j
        y = F.conv1d(x, w).view(b, c_out, k, t)
        return y.transpose(2, 3).reshape(b, c_out, t * k)                # sample t·k + j


class _Prvq(nn.Module):
    def __init__(self, cfg: CodecConfig):
        super().__init__()
        self.mus_list = nn.ParameterList(
            [nn.Parameter(torch.empty(cfg.codebook_size, cfg.latent)) for _ in range(cfg.n_codebooks)])


class _Decoder(nn.Module):
    def __init__(self, cfg: CodecConfig):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = cfg.latent
        for c, rate in zip(cfg.stage_channels, cfg.rates):
            layers.append(Upsample(c_in, c, rate))
            layers += [ConvNeXtBlock(c, cfg) for _ in range(cfg.n_blocks)]
            c_in = c
        layers.append(nn.Conv1d(c_in, 2 * cfg.n_bins, 1, bias=False))
        self.layers = nn.ModuleList(layers)                     # indices 0..12 as the checkpoint


class Codec(nn.Module):
    """`tts_model.audio_codec` decoder. Build on any device, then `load_codec` by name."""

    def __init__(self, cfg: CodecConfig):
        super().__init__()
        self.cfg = cfg
        self.prvq = _Prvq(cfg)
        self.decoder = _Decoder(cfg)
        # The 31 codebooks as one [Q, V, D] table (`load_codec` makes the checkpoint's 31
        # parameters views of it): the latent is one gather and one sum, not 31 and 30.
        self.register_buffer("codebooks", torch.empty(cfg.n_codebooks, cfg.codebook_size, cfg.latent),
                             persistent=False)
        self.decode_ops = None      # gpu.engine.decode_ops.TritonDecodeOps on the fast path

    @torch.no_grad()
    def stack_codebooks(self) -> None:
        self.codebooks = torch.stack(tuple(self.prvq.mus_list))
        for q in range(self.cfg.n_codebooks):
            self.prvq.mus_list[q] = nn.Parameter(self.codebooks[q])

    def latent(self, codes: Tensor) -> Tensor:
        """codes int [B, T, Q] → Σ_q mus_list[q][c_q] as [B, latent, T]."""
        codes = codes.long()
        books = self.codebooks                                                   # [Q, V, D]
        vecs = books[torch.arange(books.shape[0], device=codes.device), codes]  # [B, T, Q, D]
        return vecs.sum(-2).transpose(1, 2)

    def spectra(self, latent: Tensor, contexts: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
        """latent [B, D, T] → (real|imag spectra [B, 18, 441·T], the 9 new causal contexts)."""
        x, new, blocks = latent, [], iter(contexts)
        for layer in self.decoder.layers[:-1]:
            if isinstance(layer, ConvNeXtBlock):
                x, ctx = layer(x, next(blocks))
                new.append(ctx)
            else:
                x = layer(x)                                    # Upsample ×rate
        return self.to_spectra(self.decoder.layers[-1](x)), new     # conv1x1 → [B, 18, N]

    def to_spectra(self, params: Tensor) -> Tensor:
        """conv1x1 output [B, 18, N] (magnitude logits | phases) → real|imag spectra [B, 18, N]."""
        nb = self.cfg.n_bins
        mag = self.cfg.max_magnitude * torch.sigmoid(params[:, :nb] - math.log(self.cfg.max_magnitude))
        phase = params[:, nb:]
        imag = mag * torch.sin(phase)
        imag[:, 0] = 0
        imag[:, -1] = 0
        return torch.cat([mag * torch.cos(phase), imag], dim=1)

    def istft(self, spec: Tensor) -> Tensor:
        """real|imag spectra [B, 18, N] → samples [B, (N − 1)·hop + n_fft − 2·(6 + 8)]."""
        cfg = self.cfg
        w = torch.hann_window(cfg.n_fft, periodic=True, device=spec.device, dtype=spec.dtype)
        nb, n = cfg.n_bins, spec.shape[-1]
        frames = torch.fft.irfft(torch.complex(spec[:, :nb], spec[:, nb:]), n=cfg.n_fft, dim=1)
        frames = torch.minimum(torch.maximum(frames, -w[:, None]), w[:, None]) * w[:, None]
        length = (n - 1) * cfg.hop + cfg.n_fft
        fold = dict(output_size=(1, length), kernel_size=(1, cfg.n_fft), stride=(1, cfg.hop))
        ola = F.fold(frames, **fold).flatten(1)                                  # [B, length]
        env = F.fold((w * w)[None, :, None].expand(1, -1, n), **fold).flatten(1)  # Σ w²
        cut = cfg.istft_pad + cfg.stream_trim
        return (ola / env)[:, cut:length - cut]

    @torch.no_grad()
    def step(self, state: CodecState, codes: Tensor, slots: Tensor) -> Tensor:
        """codes int [B, Q] (< codebook_size: the talker substitutes silence for control codes)
        of the sessions at `slots` [B] → pcm fp32 [B, 1764]; writes only their cache rows."""
        if self.decode_ops is not None:
            return self.decode_ops.codec_step(self, state, codes, slots)
        contexts = [cache[slots] for cache in state.conv]
        spec, new = self.spectra(self.latent(codes[:, None]), contexts)
        for cache, ctx in zip(state.conv, new):
            cache[slots] = ctx
        return self.stream_pcm(state, spec, slots)

    def stream_pcm(self, state: CodecState, spec: Tensor, slots: Tensor) -> Tensor:
        """A frame's new spectra [B, 18, 441] → pcm [B, 1764], after the slots' 4 cached spectra,
        which then become the last 4 of this frame."""
        full = torch.cat([state.spec[slots], spec], dim=-1)          # [B, 18, 4 + 441]
        state.spec[slots] = full[..., -self.cfg.cache_spectra:]
        return self.istft(full)

    @torch.no_grad()
    def flush(self, state: CodecState, slots: Tensor) -> Tensor:
        """Stream end: the last 8 samples [B, 8], from zero spectra after the cache. Reads the
        state only; reset the slots afterwards."""
        spec = state.spec[slots]
        tail = spec.new_zeros(spec.shape[0], spec.shape[1], self.cfg.flush_spectra)
        return self.istft(torch.cat([spec, tail], dim=-1))

    @torch.no_grad()
    def decode_sequence(self, codes: Tensor) -> Tensor:
        """Non-streaming: codes [B, T, Q] → [B, 1764·T + 8], one pass over the whole sequence
        (zero left context, zero spectra on both ends), flush tail included."""
        cfg, b = self.cfg, codes.shape[0]
        dtype = self.decoder.layers[-1].weight.dtype
        zeros = [codes.new_zeros(b, c, cfg.cache_width, dtype=dtype) for c in cfg.block_channels]
        spec, _ = self.spectra(self.latent(codes), zeros)
        pad = (cfg.cache_spectra, cfg.flush_spectra)
        return self.istft(F.pad(spec, pad))


# ------------------------------------------------------------------------- checkpoint contract

def _convt_names(cfg: CodecConfig) -> frozenset[str]:
    return frozenset(f"{PREFIX}decoder.layers.{s * (1 + cfg.n_blocks)}.weight"
                     for s in range(len(cfg.rates)))


def param_shapes(cfg: CodecConfig) -> dict[str, tuple[int, ...]]:
    """Every codec checkpoint tensor: full name → shape (ConvT weights are [in, out, k])."""
    shapes = {f"{PREFIX}prvq.mus_list.{q}": (cfg.codebook_size, cfg.latent)
              for q in range(cfg.n_codebooks)}
    layer, c_in = 0, cfg.latent
    for c, rate in zip(cfg.stage_channels, cfg.rates):
        shapes[f"{PREFIX}decoder.layers.{layer}.weight"] = (c_in, c, rate)
        for i in range(layer + 1, layer + 1 + cfg.n_blocks):
            p = f"{PREFIX}decoder.layers.{i}."
            shapes |= {p + "dwconv.weight": (c, 1, cfg.kernel), p + "dwconv.bias": (c,),
                       p + "norm.weight": (c,), p + "norm.bias": (c,),
                       p + "pwconv1.weight": (4 * c, c, 1), p + "pwconv1.bias": (4 * c,),
                       p + "pwconv2.weight": (c, 4 * c, 1), p + "pwconv2.bias": (c,)}
        layer, c_in = layer + 1 + cfg.n_blocks, c
    shapes[f"{PREFIX}decoder.layers.{layer}.weight"] = (2 * cfg.n_bins, c_in, 1)
    return shapes


def init_random(cfg: CodecConfig, generator: torch.Generator) -> dict[str, Tensor]:
    """docs/MODEL.md §8: codebooks N(0, 1); conv weights N(0, 1/fan_in), pwconv2 also ×1/√(2·9);
    biases 0; LayerNorm weight 1."""
    convt, out = _convt_names(cfg), {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith(".bias"):
            out[name] = torch.zeros(shape)
        elif name.endswith("norm.weight"):
            out[name] = torch.ones(shape)
        else:
            # Codebooks: 1. ConvT [in, out, k = stride]: each output sample sees one tap of `in`
            # channels. Conv [out, in/groups, k]: in/groups · k.
            fan_in = 1 if ".mus_list." in name else shape[0] if name in convt else shape[1] * shape[2]
            std = fan_in ** -0.5
            if name.endswith("pwconv2.weight"):
                std /= (2 * len(cfg.block_channels)) ** 0.5
            out[name] = torch.randn(shape, generator=generator) * std
    return out


def load_codec(codec: Codec, weights: Mapping[str, Tensor]) -> None:
    """Load by checkpoint name (an encoder subtree or other tensors in `weights` are ignored)."""
    load_named(codec, weights, param_shapes(codec.cfg), frozenset(), PREFIX)
    codec.stack_codebooks()
