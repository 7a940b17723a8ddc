"""Mel front end (docs/MODEL.md §2.1): 16 kHz audio → natural-log mel columns, 1280 samples per frame.

Algorithm. y[n] = x[n] − 0.97·x[n−1] with x[−1] = 0 (NeMo keeps the first sample). Column j is the
512-point FFT of the pre-emphasised samples [160j − 256, 160j + 256) under a 400-sample Hann window
centred in the 512 (torch.stft, center=True); before the stream the signal is padded with zeros
(`pad_mode="constant"`, NeMo's featurizer) or its mirror image (`"reflect"`, TM's incremental mel).
m_j = log(fb·|X_j|² + 2^-24); no dither, no per-feature normalisation.

Streaming. Perception consumes the columns in NeMo's cache-aware chunks: column 0 alone on frame 0,
then columns 8k−7 … 8k on frame k (TM `make_streaming_mel_step`). Frame k therefore emits exactly
those 8 columns: they need pre-emphasised samples [1280k − 1376, 1280k + 256), i.e. a 1376-sample
tail of earlier audio plus the first 256 new samples. On frame 0 the 7 columns before column 0 do
not exist and are emitted as zeros, which is also how NeMo pads its pre-encode cache. The state
keeps the tail, the last raw sample (pre-emphasis across frames) and the last 9 columns, which
with the 8 new ones form the 17-column window perception reads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gpu.model.slots import fill_slots

PREFIX = "stt_model.perception.preprocessor.featurizer."


@dataclass(frozen=True)
class MelConfig:
    sample_rate: int = 16_000
    frame_samples: int = 1280       # one 80 ms frame
    n_fft: int = 512
    win_length: int = 400           # `window` [400] in the checkpoint
    hop: int = 160
    n_mels: int = 128
    preemph: float = 0.97
    log_guard: float = 2.0 ** -24
    pad_mode: str = "constant"      # "constant" (NeMo) or "reflect" (TM); see the top comment
    history: int = 9                # columns kept for perception's pre-encode cache

    def __post_init__(self):
        assert self.frame_samples % self.hop == 0 and self.pad_mode in ("constant", "reflect")

    @classmethod
    def full(cls) -> "MelConfig":
        return cls()

    @classmethod
    def tiny(cls) -> "MelConfig":
        return cls(n_mels=32)       # same framing; fewer bins so nothing can assume 128

    @property
    def n_freq(self) -> int:
        return self.n_fft // 2 + 1                                  # 257

    @property
    def cols_per_frame(self) -> int:
        return self.frame_samples // self.hop                       # 8

    @property
    def tail_len(self) -> int:
        return (self.cols_per_frame - 1) * self.hop + self.n_fft // 2   # 1376 samples

    @property
    def span(self) -> int:
        return (self.cols_per_frame - 1) * self.hop + self.n_fft        # 1632 samples: 8 columns

    @property
    def window_cols(self) -> int:
        return self.history + self.cols_per_frame                   # 17


def param_shapes(cfg: MelConfig) -> dict[str, tuple]:
    return {PREFIX + "fb": (1, cfg.n_mels, cfg.n_freq), PREFIX + "window": (cfg.win_length,)}


def slaney_mel_filterbank(cfg: MelConfig) -> Tensor:
    """librosa.filters.mel(sr, n_fft, n_mels, fmin=0, fmax=sr/2, norm='slaney') as [n_mels, n_freq]."""
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, math.log(6.4) / 27.0

    def hz_to_mel(f: Tensor) -> Tensor:     # Slaney: linear below 1 kHz, logarithmic above
        lin = f / f_sp
        return torch.where(f >= min_log_hz, min_log_hz / f_sp + torch.log(f / min_log_hz) / logstep, lin)

    def mel_to_hz(m: Tensor) -> Tensor:
        lin = m * f_sp
        return torch.where(m >= min_log_hz / f_sp, min_log_hz * torch.exp(logstep * (m - min_log_hz / f_sp)), lin)

    fft_hz = torch.linspace(0, cfg.sample_rate / 2, cfg.n_freq, dtype=torch.float64)
    top = hz_to_mel(torch.tensor(cfg.sample_rate / 2, dtype=torch.float64))
    edges = mel_to_hz(torch.linspace(0.0, float(top), cfg.n_mels + 2, dtype=torch.float64))
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    tri = torch.minimum((fft_hz - lo) / (mid - lo), (hi - fft_hz) / (hi - mid)).clamp_min(0.0)
    return (tri * (2.0 / (hi - lo))).float()                       # area normalisation


def init_random(cfg: MelConfig, generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """The featurizer is not random: a real Slaney mel filterbank and a symmetric Hann window."""
    return {PREFIX + "fb": slaney_mel_filterbank(cfg)[None],
            PREFIX + "window": torch.hann_window(cfg.win_length, periodic=False)}


@dataclass
class MelState:
    """Per-slot streaming state, fp32. Invariant: after k frames, `tail` holds pre-emphasised samples
    [1280k − 1376, 1280k), `prev` raw sample 1280k − 1, `hist` columns 8k − 16 … 8k − 8 (zeros
    before column 0)."""
    tail: Tensor    # [S, 1376] pre-emphasised samples
    prev: Tensor    # [S] last raw sample
    hist: Tensor    # [S, 9, n_mels] last 9 emitted columns
    frames: Tensor  # [S] long, frames consumed

    @classmethod
    def alloc(cls, cfg: MelConfig, max_slots: int, device=None) -> "MelState":
        z = lambda *s: torch.zeros(*s, device=device)
        return cls(z(max_slots, cfg.tail_len), z(max_slots), z(max_slots, cfg.history, cfg.n_mels),
                   torch.zeros(max_slots, dtype=torch.long, device=device))

    def reset(self, slots: Tensor) -> None:
        for t in (self.tail, self.prev, self.hist, self.frames):
            fill_slots(t, slots, 0)


@dataclass
class MelOutput:
    new: Tensor      # [B, 8, n_mels] columns 8k−7 … 8k (zeros for j < 0)
    window: Tensor   # [B, 17, n_mels] the 9 cached + 8 new columns, oldest first


class MelFrontEnd(nn.Module):
    """Holds `fb` and `window` as buffers; state_dict keys = param_shapes names minus PREFIX."""

    def __init__(self, cfg: MelConfig, device=None):
        super().__init__()
        self.cfg = cfg
        self.register_buffer("fb", torch.zeros(1, cfg.n_mels, cfg.n_freq, device=device))
        self.register_buffer("window", torch.zeros(cfg.win_length, device=device))

    def load_named(self, tensors: dict[str, Tensor]) -> None:
        self.load_state_dict({k[len(PREFIX):]: tensors[k].float() for k in param_shapes(self.cfg)},
                             strict=True, assign=True)

    def _log_mel(self, y: Tensor, center: bool) -> Tensor:
        """[B, N] pre-emphasised samples → [B, columns, n_mels]."""
        c = self.cfg
        spec = torch.stft(y, c.n_fft, c.hop, c.win_length, self.window, center=center,
                          pad_mode=c.pad_mode, return_complex=True)     # [B, n_freq, columns]
        power = spec.real.square() + spec.imag.square()
        return torch.log(torch.einsum("mf,bft->btm", self.fb[0], power) + c.log_guard)

    @torch.no_grad()
    def forward_utterance(self, audio: Tensor) -> Tensor:
        """Non-streaming: audio [B, N] → all N//160 + 1 centred columns [B, N//160 + 1, n_mels]."""
        y = torch.cat([audio[:, :1], audio[:, 1:] - self.cfg.preemph * audio[:, :-1]], dim=1)
        return self._log_mel(y, center=True)

    @torch.no_grad()
    def step(self, state: MelState, audio: Tensor, slots: Tensor) -> MelOutput:
        """One frame for B sessions: audio [B, 1280] fp32. Reads and writes rows `slots` of state."""
        c = self.cfg
        tail, prev, hist, frames = state.tail[slots], state.prev[slots], state.hist[slots], state.frames[slots]
        first = frames == 0                                                    # [B]
        y = audio - c.preemph * torch.cat([prev[:, None], audio[:, :-1]], dim=1)
        if c.pad_mode == "reflect":      # column 0 sees y[256] … y[1] before y[0]
            mirror = y[:, 1:c.n_fft // 2 + 1].flip(-1)
            tail = torch.where(first[:, None], torch.cat([tail[:, :-mirror.shape[1]], mirror], 1), tail)
        buf = torch.cat([tail, y], dim=1)                                      # [B, 1376 + 1280]
        new = self._log_mel(buf[:, :c.span], center=False)                     # [B, 8, n_mels]
        before_start = first[:, None] & (torch.arange(c.cols_per_frame, device=audio.device) < c.cols_per_frame - 1)
        new = new.masked_fill(before_start[:, :, None], 0.0)
        window = torch.cat([hist, new], dim=1)                                 # [B, 17, n_mels]
        state.tail[slots] = buf[:, -c.tail_len:]
        state.prev[slots] = audio[:, -1]
        state.hist[slots] = window[:, -c.history:]
        state.frames[slots] = frames + 1
        return MelOutput(new, window)
