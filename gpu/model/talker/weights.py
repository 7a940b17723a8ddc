"""Talker checkpoint contract (docs/MODEL.md §7), random weights (§8) and loading by name.

`param_shapes(cfg)` is the exact set of `tts_model.*` tensors the talker reads (TM's
`required_checkpoint_shapes` plus the three `tts_model.` buffers), shapes derived from the config;
`integer_buffers(cfg)` says which are integers (loaded as int32). `init_random` draws a dict with
exactly those names, so the random and the real-checkpoint paths load identically.
`load_named` is the loader both talker and codec use: pick the names, check shapes, cast, assign.
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor, nn

from gpu.model.talker.config import TalkerConfig
from gpu.model.talker.talker import PREFIX, Talker

NET = PREFIX + "tts_model."                 # the EAR-TTS network's checkpoint prefix


def _mlp(prefix: str, hidden: int, inner: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}gate_proj.weight": (inner, hidden), f"{prefix}up_proj.weight": (inner, hidden),
            f"{prefix}down_proj.weight": (hidden, inner)}


def _attention(prefix: str, cfg: TalkerConfig) -> dict[str, tuple[int, ...]]:
    q, kv, h = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.hidden
    return {f"{prefix}q_proj.weight": (q, h), f"{prefix}k_proj.weight": (kv, h),
            f"{prefix}v_proj.weight": (kv, h), f"{prefix}o_proj.weight": (h, q)}


def _norms(prefix: str, names: tuple[str, ...], dim: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}{n}.weight": (dim,) for n in names}


def _backbone(cfg: TalkerConfig) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(cfg.n_layers):
        p = f"{NET}backbone.layers.{i}."
        shapes |= _norms(p, ("input_layernorm", "post_attention_layernorm",
                             "pre_feedforward_layernorm", "post_feedforward_layernorm"), cfg.hidden)
        shapes |= _attention(p + "self_attn.", cfg)
        shapes |= _norms(p + "self_attn.", ("q_norm", "k_norm"), cfg.head_dim)
        shapes |= _mlp(p + "mlp.", cfg.hidden, cfg.mlp)
    shapes[f"{NET}backbone.norm.weight"] = (cfg.hidden,)
    return shapes


def _char_encoder(cfg: TalkerConfig) -> dict[str, tuple[int, ...]]:
    e, h = f"{NET}embed_subword.", cfg.hidden
    layer = e + "backbone.encoder.layers.0."
    shapes = {f"{e}embed_tokens.weight": (cfg.n_chars + 1, h), f"{e}proj_embedding.weight": (h, h)}
    shapes |= _norms(layer, ("pre_self_attn_layernorm", "post_self_attn_layernorm",
                             "pre_feedforward_layernorm", "post_feedforward_layernorm"), h)
    shapes |= _attention(layer + "self_attn.", cfg) | _mlp(layer + "mlp.", h, cfg.mlp)
    shapes[f"{e}backbone.encoder.norm.weight"] = (h,)
    shapes |= {f"{e}subword_flag_emb.cont_emb.weight": (2, h),
               f"{e}subword_flag_emb.is_continuation": (cfg.text_vocab + 1,),
               f"{e}subword_flag_emb.pad_tensor": (),
               f"{e}bos_eos_emb.special_emb.weight": (3, h),
               f"{e}bos_eos_emb.special_flags": (cfg.text_vocab,),
               f"{e}bos_eos_emb.pad_tensor": ()}
    return shapes


def _mog(cfg: TalkerConfig) -> dict[str, tuple[int, ...]]:
    g, h = f"{NET}mog_head.", cfg.hidden
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(cfg.mog_layers):
        shapes |= _norms(f"{g}mlp_stack.{i}.", ("pre_norm", "post_norm"), h)
        shapes |= _mlp(f"{g}mlp_stack.{i}.mlp.", h, cfg.mlp)
    shapes[f"{g}mlp_stack.{cfg.mog_layers}.weight"] = (h,)
    return shapes | {f"{g}proj_logits.weight": (cfg.n_mixtures, h),
                     f"{g}proj_mus.weight": (cfg.n_mixtures * cfg.low_rank, h),
                     f"{g}proj_logs.weight": (1, h),
                     f"{g}proj_else.weight": (cfg.latent, h),
                     f"{g}low_mat": (cfg.n_mixtures, cfg.latent, cfg.low_rank)}


def _misc(cfg: TalkerConfig) -> dict[str, tuple[int, ...]]:
    h, f = cfg.hidden, f"{NET}gated_fusion_audio_text."
    return {f"{NET}embed_code.weight": (h, cfg.latent),
            f"{NET}rvq_embs": (cfg.n_codebooks, cfg.codebook_size, cfg.latent),
            f"{NET}bos_emb": (h,), f"{NET}null_emb": (h,),
            f"{NET}audio_prompt_projection_W": (h, h),
            f"{f}audio_proj.weight": (h, h), f"{f}audio_proj.bias": (h,),
            f"{f}text_proj.weight": (h, h), f"{f}text_proj.bias": (h,),
            f"{f}gate": (h,), f"{f}residual_scale": (), f"{f}final_norm.weight": (h,),
            f"{PREFIX}codec_silence_tokens": (cfg.n_codebooks,),
            f"{PREFIX}_control_codes": (3,),
            f"{PREFIX}audio_prompt_latents.Aria": (1, cfg.n_warmup, h)}


def param_shapes(cfg: TalkerConfig) -> dict[str, tuple[int, ...]]:
    """Every talker checkpoint tensor: full name → shape."""
    return _backbone(cfg) | _char_encoder(cfg) | _mog(cfg) | _misc(cfg)


def integer_buffers(cfg: TalkerConfig) -> frozenset[str]:
    e = f"{NET}embed_subword."
    return frozenset({f"{e}subword_flag_emb.is_continuation", f"{e}subword_flag_emb.pad_tensor",
                      f"{e}bos_eos_emb.special_flags", f"{e}bos_eos_emb.pad_tensor",
                      f"{PREFIX}codec_silence_tokens", f"{PREFIX}_control_codes"})


# ------------------------------------------------------------------------------ random init

_STANDARD_NORMAL = ("embed_tokens.weight", "cont_emb.weight", "special_emb.weight", "rvq_embs",
                    "bos_emb", "null_emb", "Aria")
_ZERO = ("norm.weight", ".bias", ".gate", "residual_scale")    # Gemma (1 + w) norms: w = 0


def _random_int(name: str, shape: tuple[int, ...], cfg: TalkerConfig,
                g: torch.Generator) -> Tensor:
    if name.endswith("_control_codes"):
        return torch.tensor(cfg.control_codes, dtype=torch.int32)
    high = {"codec_silence_tokens": cfg.codebook_size, "is_continuation": 2,
            "special_flags": 3}.get(name.rsplit(".", 1)[-1], 1)      # pad_tensor → 0
    return torch.randint(0, high, shape, generator=g, dtype=torch.int32)


def _stack_depth(name: str, cfg: TalkerConfig) -> int:
    """Layers of the residual stack a weight belongs to (for the 1/√(2·layers) output scale)."""
    if ".backbone.layers." in name:
        return cfg.n_layers
    return cfg.mog_layers if ".mog_head." in name else 1


def _random_float(name: str, shape: tuple[int, ...], cfg: TalkerConfig,
                  g: torch.Generator) -> Tensor:
    if name.endswith(_ZERO) or name.endswith(f"mlp_stack.{cfg.mog_layers}.weight"):
        return torch.zeros(shape)
    std = 1.0
    if name.endswith("low_mat"):
        std = cfg.low_rank ** -0.5                        # low_mat[k]: rank r → latent
    elif not name.endswith(_STANDARD_NORMAL):
        std = shape[1] ** -0.5                            # Linear [out, in]: N(0, 1/fan_in)
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            std /= (2 * _stack_depth(name, cfg)) ** 0.5
    return torch.randn(shape, generator=g) * std


def init_random(cfg: TalkerConfig, generator: torch.Generator) -> dict[str, Tensor]:
    """A checkpoint-shaped dict of random weights (docs/MODEL.md §8), on the CPU."""
    ints = integer_buffers(cfg)
    return {name: (_random_int if name in ints else _random_float)(name, shape, cfg, generator)
            for name, shape in param_shapes(cfg).items()}


# ----------------------------------------------------------------------------------- loading

def load_named(module: nn.Module, weights: Mapping[str, Tensor], shapes: dict[str, tuple],
               integers: frozenset[str], prefix: str) -> None:
    """Load exactly the tensors of `shapes` (other names in `weights` are ignored) into a module
    whose state_dict names are those names minus `prefix`: shapes checked, integer buffers
    int32, the rest fp32, tensors assigned (so a meta-built module becomes real)."""
    missing = [n for n in shapes if n not in weights]
    if missing:
        raise KeyError(f"{len(missing)} tensors missing, e.g. {missing[:3]}")
    state = {}
    for name, shape in shapes.items():
        t = weights[name]
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
        state[name[len(prefix):]] = t.to(torch.int32 if name in integers else torch.float32)
    module.load_state_dict(state, strict=True, assign=True)


def load_talker(talker: Talker, weights: Mapping[str, Tensor]) -> None:
    load_named(talker, weights, param_shapes(talker.cfg), integer_buffers(talker.cfg), PREFIX)
    talker.tts_model.derive_tables()
