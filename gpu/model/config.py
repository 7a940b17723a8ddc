"""The whole model's configuration and precision profiles (docs/MODEL.md §3, §4), in one place.

`VoiceChatConfig` aggregates the six component configs (mel, perception, RNNT, thinker, talker,
codec). The small ones are derived from their neighbours, never repeated: perception reads the
mel's bins, the RNNT the Conformer width, perception projects to the thinker's hidden size, the
talker's character table spans the thinker's vocabulary and the codec decodes the talker's
codebooks. `__post_init__` re-checks every joint so a hand-built config cannot drift.

`Profile` says which dtype each part computes and keeps state in (§4): thinker and perception in
bf16 (the Mamba SSM state fp32, or stored in bf16 in dense-ssm16), mel / RNNT / talker / codec
fp32 (TF32 matmul allowed on a GPU), talker KV fp32 with CFG (reference) or bf16 without CFG
(dense); `fp32` is the test variant (everything fp32, CFG on) the parity tests compare against.

Bytes per session of a profile and context come from the allocated state itself:
`voicechat_state.session_state_bytes` (it needs the state classes, which import this module).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from gpu.model.codec import CodecConfig
from gpu.model.mel import MelConfig
from gpu.model.perception_weights import PerceptionConfig
from gpu.model.rnnt import RNNTConfig
from gpu.model.talker.config import TalkerConfig
from gpu.model.thinker_weights import ThinkerConfig


@dataclass(frozen=True)
class VoiceChatConfig:
    name: str
    mel: MelConfig
    perception: PerceptionConfig
    rnnt: RNNTConfig
    thinker: ThinkerConfig
    talker: TalkerConfig
    codec: CodecConfig

    def __post_init__(self):
        m, p, r, th, tk, c = self.mel, self.perception, self.rnnt, self.thinker, self.talker, self.codec
        joints = {
            "perception.mel_bins == mel.n_mels": p.mel_bins == m.n_mels,
            "perception.window_cols == mel.window_cols": p.window_cols == m.window_cols,
            "perception.new_cols == mel.cols_per_frame": p.new_cols == m.cols_per_frame,
            "perception.out_dim == thinker.hidden": p.out_dim == th.hidden,
            "rnnt.enc_dim == perception.d_model": r.enc_dim == p.d_model,
            "talker.text_vocab == thinker.vocab": tk.text_vocab == th.vocab,
            "codec.n_codebooks == talker.n_codebooks": c.n_codebooks == tk.n_codebooks,
            "codec.codebook_size == talker.codebook_size": c.codebook_size == tk.codebook_size,
        }
        broken = [k for k, ok in joints.items() if not ok]
        if broken:
            raise ValueError(f"config {self.name!r} does not fit together: {broken}")

    @classmethod
    def assemble(cls, name: str, mel: MelConfig, perception: PerceptionConfig, rnnt: RNNTConfig,
                 thinker: ThinkerConfig, talker: TalkerConfig, codec: CodecConfig) -> "VoiceChatConfig":
        """Build from component configs, deriving every joint from the upstream network."""
        perception = dataclasses.replace(perception, mel_bins=mel.n_mels, history_cols=mel.history,
                                         new_cols=mel.cols_per_frame, out_dim=thinker.hidden)
        rnnt = dataclasses.replace(rnnt, enc_dim=perception.d_model)
        talker = dataclasses.replace(talker, text_vocab=thinker.vocab)
        codec = dataclasses.replace(codec, n_codebooks=talker.n_codebooks,
                                    codebook_size=talker.codebook_size)
        return cls(name, mel, perception, rnnt, thinker, talker, codec)

    @classmethod
    def full(cls) -> "VoiceChatConfig":
        return cls.assemble("full", MelConfig.full(), PerceptionConfig.full(), RNNTConfig.full(),
                            ThinkerConfig.full(), TalkerConfig.full(), CodecConfig.full())

    @classmethod
    def tiny(cls) -> "VoiceChatConfig":
        """Every network's tiny config. The talker keeps the full model's KV cap (7500 positions):
        the cap is a serving limit, not a shape, and a CPU session must hold `max_context`."""
        thinker = ThinkerConfig.tiny()
        talker = dataclasses.replace(TalkerConfig.tiny(text_vocab=thinker.vocab),
                                     max_positions=TalkerConfig.full().max_positions)
        return cls.assemble("tiny", MelConfig.tiny(), PerceptionConfig.tiny(), RNNTConfig.tiny(),
                            thinker, talker, CodecConfig.tiny())

    @classmethod
    def named(cls, name: str) -> "VoiceChatConfig":
        if name not in ("full", "tiny"):
            raise ValueError(f"unknown model config {name!r}; choose full or tiny")
        return getattr(cls, name)()

    def with_max_chars(self, max_chars: int) -> "VoiceChatConfig":
        """The same model with the talker's character table M_c wide (read from a tokenizer)."""
        return dataclasses.replace(self, talker=dataclasses.replace(self.talker, max_chars=max_chars))


@dataclass(frozen=True)
class Profile:
    """Dtypes per part (docs/MODEL.md §4)."""
    name: str
    compute: torch.dtype          # thinker + perception weights, activations, thinker KV, Mamba
                                  # conv state, perception caches
    talker_kv: torch.dtype
    cfg_rows: int                 # 2: classifier-free guidance on (two talker streams); 1: off
    tf32: bool = True             # TF32 matmul for talker / codec / RNNT (GPU only)
    # Mamba SSM state as stored between frames; its arithmetic is fp32 in every profile (each
    # step loads it to fp32 and rounds once on the way back)
    ssm: torch.dtype = torch.float32
    # how a bf16 state is rounded after each step: "nearest", or "stochastic" (unbiased, by
    # hashed bits: gpu/model/formats.py)
    ssm_round: str = "nearest"

    fp32 = torch.float32          # mel, RNNT, talker, codec weights and states

    def __post_init__(self):
        if self.cfg_rows not in (1, 2):
            raise ValueError("cfg_rows is 1 (CFG off) or 2 (CFG on)")
        if self.ssm_round not in ("nearest", "stochastic") or (
                self.ssm_round == "stochastic" and self.ssm != torch.bfloat16):
            raise ValueError("ssm_round is nearest, or stochastic for a bf16 SSM state")

    @property
    def talker_profile(self) -> str:
        """The talker's own profile name: it picks the number of CFG rows."""
        return "reference" if self.cfg_rows == 2 else "dense"

    @classmethod
    def named(cls, name: str) -> "Profile":
        if name not in PROFILES:
            raise ValueError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}")
        return PROFILES[name]


PROFILES: dict[str, Profile] = {
    "reference": Profile("reference", torch.bfloat16, torch.float32, 2),
    "dense": Profile("dense", torch.bfloat16, torch.bfloat16, 1),
    # dense with the SSM state stored in bf16: half its bytes, moved and held
    "dense-ssm16": Profile("dense-ssm16", torch.bfloat16, torch.bfloat16, 1, ssm=torch.bfloat16),
    # and that state rounded stochastically, not to nearest
    "dense-ssm16-sr": Profile("dense-ssm16-sr", torch.bfloat16, torch.bfloat16, 1,
                              ssm=torch.bfloat16, ssm_round="stochastic"),
    # and the talker's KV in fp8 e4m3 with a scale per layer and kv head, set at load; the
    # state rounded stochastically: to nearest, the thinker's KL drifts up over a call
    "dense-compact": Profile("dense-compact", torch.bfloat16, torch.float8_e4m3fn, 1,
                             ssm=torch.bfloat16, ssm_round="stochastic"),
    "fp32": Profile("fp32", torch.float32, torch.float32, 2, tf32=False),          # tests
    "fp32-dense": Profile("fp32-dense", torch.float32, torch.float32, 1, tf32=False),  # tests
}
