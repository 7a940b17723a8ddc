"""RNNT recognition of the user's speech (docs/MODEL.md §2.3) and the turn-taking counters it drives.

Algorithm, per frame and session (NeMo greedy RNNT, blank = 1024, at most 10 symbols per frame):
f = enc(e_t); then 10 times: z = joint_net.2(ReLU(f + pred(g))), k = argmax z; if k is blank (or an
earlier step was) the session stops emitting, else it emits k and (g, h, c) ← LSTM(embed[k], (h, c)).
The state (h, c) is the LSTM state that produced g, so a session starts from g, (h, c) = LSTM(
embed[blank], 0): NeMo primes the predictor with blank (a zero row, padding_idx) from a zero state
and keeps that primed state when it emits the first token. docs/MODEL.md's "h = c = 0, g = LSTM output
for blank" is the same start described one step earlier.

Work never depends on values (§8): every frame runs all 10 joint and LSTM steps for every session,
and a session that stopped keeps its state through masked `where`s. Tokens come out padded with −1.

Turn taking: a frame is speech when it emitted ≥ 1 token. Beginning of utterance when not in an
utterance and the speech run reaches 3 frames (2 for a session's first turn); end of utterance when
in one and the blank run reaches 15 (TM session_state.h, NeMo Triton `S2S_RNNT_EOU_FRAMES`).
Barge-in (3 speech frames while the assistant speaks) needs the assistant's state, which the
engine has: it reads `speech_run`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gpu.model.slots import fill_slots

PREFIX = "stt_model."


@dataclass(frozen=True)
class RNNTConfig:
    vocab: int = 1024            # SentencePiece pieces; blank = vocab
    enc_dim: int = 1024          # = PerceptionConfig.d_model (raw Conformer output, before proj)
    pred_dim: int = 640
    joint_dim: int = 640
    lstm_layers: int = 2
    max_symbols: int = 10
    bou_frames: int = 3
    bou_frames_first: int = 2
    eou_frames: int = 15

    @classmethod
    def full(cls) -> "RNNTConfig":
        return cls()

    @classmethod
    def tiny(cls) -> "RNNTConfig":
        return cls(vocab=31, enc_dim=32, pred_dim=16, joint_dim=24)   # enc_dim = PerceptionConfig.tiny().d_model

    @property
    def blank(self) -> int:
        return self.vocab                    # 1024

    @property
    def n_classes(self) -> int:
        return self.vocab + 1                # 1025


def param_shapes(cfg: RNNTConfig) -> dict[str, tuple]:
    P, J = cfg.pred_dim, cfg.joint_dim
    s = {PREFIX + "rnnt_decoder.prediction.embed.weight": (cfg.n_classes, P)}
    for l in range(cfg.lstm_layers):
        lstm = f"{PREFIX}rnnt_decoder.prediction.dec_rnn.lstm."
        s[f"{lstm}weight_ih_l{l}"], s[f"{lstm}weight_hh_l{l}"] = (4 * P, P), (4 * P, P)
        s[f"{lstm}bias_ih_l{l}"], s[f"{lstm}bias_hh_l{l}"] = (4 * P,), (4 * P,)
    for name, (o, i) in {"enc": (J, cfg.enc_dim), "pred": (J, P), "joint_net.2": (cfg.n_classes, J)}.items():
        s[f"{PREFIX}rnnt_joint.{name}.weight"], s[f"{PREFIX}rnnt_joint.{name}.bias"] = (o, i), (o,)
    return s


def init_random(cfg: RNNTConfig, generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """§8: embedding N(0,1) with the blank row 0 (NeMo padding_idx), weights N(0, 1/fan_in), biases 0."""
    out = {}
    for name, shape in param_shapes(cfg).items():
        if "bias" in name:
            out[name] = torch.zeros(shape)
        elif name.endswith("embed.weight"):
            out[name] = torch.randn(shape, generator=generator)
            out[name][cfg.blank] = 0.0
        else:
            out[name] = torch.randn(shape, generator=generator) / math.sqrt(shape[1])
    return out


@dataclass
class RNNTState:
    """Per-slot decoder and turn state, fp32. Invariant: g, (h, c) = LSTM(embed[last emitted token or
    blank], previous (h, c)). `start_*` are the fresh-session rows (they depend on the weights)."""
    h: Tensor             # [S, layers, P]
    c: Tensor             # [S, layers, P]
    g: Tensor             # [S, P] predictor output the next joint step reads
    speech_run: Tensor    # [S] long, consecutive frames with ≥ 1 token
    blank_run: Tensor     # [S] long, consecutive frames without tokens
    in_utterance: Tensor  # [S] bool
    turns: Tensor         # [S] long, utterances begun (the first uses bou_frames_first)
    start_h: Tensor       # [layers, P]
    start_c: Tensor       # [layers, P]
    start_g: Tensor       # [P]

    @classmethod
    def alloc(cls, model: "RNNT", max_slots: int) -> "RNNTState":
        g0, h0, c0 = model.start_rows()
        long = lambda: torch.zeros(max_slots, dtype=torch.long, device=g0.device)
        st = cls(h0.expand(max_slots, -1, -1).clone(), c0.expand(max_slots, -1, -1).clone(),
                 g0.expand(max_slots, -1).clone(), long(), long(),
                 torch.zeros(max_slots, dtype=torch.bool, device=g0.device), long(), h0, c0, g0)
        return st

    def reset(self, slots: Tensor) -> None:
        self.h[slots], self.c[slots], self.g[slots] = self.start_h, self.start_c, self.start_g
        for t in (self.speech_run, self.blank_run, self.in_utterance, self.turns):
            fill_slots(t, slots, 0)


@dataclass
class RNNTOutput:
    tokens: Tensor        # [B, max_symbols] long, emitted pieces then −1
    n_tokens: Tensor      # [B] long
    bou: Tensor           # [B] bool, an utterance began this frame
    eou: Tensor           # [B] bool, an utterance ended this frame
    speech_run: Tensor    # [B] long, after this frame
    in_utterance: Tensor  # [B] bool, after this frame


class RNNT(nn.Module):
    """state_dict keys = param_shapes names minus PREFIX."""

    def __init__(self, cfg: RNNTConfig, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.cfg = cfg
        lstm = nn.LSTM(cfg.pred_dim, cfg.pred_dim, cfg.lstm_layers, batch_first=True, **kw)
        embed = nn.Embedding(cfg.n_classes, cfg.pred_dim, **kw)
        self.rnnt_decoder = nn.ModuleDict({"prediction": nn.ModuleDict(
            {"embed": embed, "dec_rnn": nn.ModuleDict({"lstm": lstm})})})
        self.rnnt_joint = nn.ModuleDict({
            "enc": nn.Linear(cfg.enc_dim, cfg.joint_dim, **kw), "pred": nn.Linear(cfg.pred_dim, cfg.joint_dim, **kw),
            "joint_net": nn.Sequential(nn.ReLU(), nn.Identity(), nn.Linear(cfg.joint_dim, cfg.n_classes, **kw))})

    def load_named(self, tensors: dict[str, Tensor]) -> None:
        dtype = self.rnnt_joint["enc"].weight.dtype
        self.load_state_dict({k[len(PREFIX):]: tensors[k].to(dtype) for k in param_shapes(self.cfg)},
                             strict=True, assign=True)

    def _predict(self, k: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One LSTM step: k [B] token, h/c [B, layers, P] → g [B, P], h, c."""
        pred = self.rnnt_decoder["prediction"]
        # cuDNN's LSTM is not CUDA-graph-capture safe at full size; the native one-step kernels
        # are, and a one-step LSTM gains nothing from cuDNN. (No effect on the CPU.)
        with torch.backends.cudnn.flags(enabled=False):
            out, (h2, c2) = pred["dec_rnn"]["lstm"](pred["embed"](k)[:, None],
                                                    (h.transpose(0, 1).contiguous(),
                                                     c.transpose(0, 1).contiguous()))
        return out[:, 0], h2.transpose(0, 1), c2.transpose(0, 1)

    @torch.no_grad()
    def start_rows(self) -> tuple[Tensor, Tensor, Tensor]:
        """g, h, c of a fresh session: the predictor primed with blank from a zero state."""
        cfg, dev = self.cfg, self.rnnt_joint["enc"].weight.device
        zero = torch.zeros(1, cfg.lstm_layers, cfg.pred_dim, device=dev, dtype=self.rnnt_joint["enc"].weight.dtype)
        g, h, c = self._predict(torch.full((1,), cfg.blank, device=dev), zero, zero)
        return g[0], h[0], c[0]

    def joint(self, f: Tensor, g: Tensor) -> Tensor:
        """f = enc(e) [B, J], g [B, P] → logits [B, 1025]."""
        return self.rnnt_joint["joint_net"](f + self.rnnt_joint["pred"](g))

    @torch.no_grad()
    def step(self, state: RNNTState, enc: Tensor, slots: Tensor) -> RNNTOutput:
        """One frame for B sessions: enc = e_t [B, enc_dim]. Always 10 masked joint + LSTM steps."""
        cfg = self.cfg
        h, c, g = state.h[slots], state.c[slots], state.g[slots]
        f = self.rnnt_joint["enc"](enc.to(g.dtype))
        active = torch.ones(enc.shape[0], dtype=torch.bool, device=enc.device)
        tokens = []
        for _ in range(cfg.max_symbols):
            k = self.joint(f, g).argmax(-1)                                     # [B]
            active = active & (k != cfg.blank)                                  # a blank ends the frame
            tokens.append(torch.where(active, k, -1))
            g2, h2, c2 = self._predict(k, h, c)
            g = torch.where(active[:, None], g2, g)
            h = torch.where(active[:, None, None], h2, h)
            c = torch.where(active[:, None, None], c2, c)
        state.h[slots], state.c[slots], state.g[slots] = h, c, g
        tokens = torch.stack(tokens, dim=1)                                      # [B, 10]
        n = (tokens >= 0).sum(1)
        bou, eou = self._turns(state, n > 0, slots)
        return RNNTOutput(tokens, n, bou, eou, state.speech_run[slots], state.in_utterance[slots])

    def _turns(self, state: RNNTState, speech: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
        """Update the speech/blank runs and the utterance flag of `slots`; return (bou, eou) [B]."""
        cfg = self.cfg
        run = torch.where(speech, state.speech_run[slots] + 1, 0)
        blank = torch.where(speech, 0, state.blank_run[slots] + 1)
        inside, turns = state.in_utterance[slots], state.turns[slots]
        need = torch.where(turns == 0, cfg.bou_frames_first, cfg.bou_frames)
        bou = ~inside & (run >= need)
        eou = inside & (blank >= cfg.eou_frames)
        state.speech_run[slots], state.blank_run[slots] = run, blank
        state.in_utterance[slots] = (inside | bou) & ~eou
        state.turns[slots] = turns + bou.long()
        return bou, eou
