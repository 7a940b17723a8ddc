"""The whole checkpoint's contract (docs/MODEL.md §7): every tensor name, its shape, the network that
owns it and the dtype it loads as under a profile; plus random weights under exactly those names
(§8), so random and real checkpoints take the same loading path.

Every shape comes from the networks' own `param_shapes(cfg)`; nothing is restated here.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from gpu.model import codec as codec_mod
from gpu.model import mel as mel_mod
from gpu.model import perception_weights
from gpu.model import rnnt as rnnt_mod
from gpu.model import thinker_weights
from gpu.model.config import Profile, VoiceChatConfig
from gpu.model.talker import weights as talker_weights

NETWORKS = ("mel", "perception", "rnnt", "thinker", "talker", "codec")
IGNORED_PREFIXES = ("tts_model.audio_codec.encoder.",)     # codec encoder: not used (§7)


def _sources(cfg: VoiceChatConfig) -> dict[str, dict[str, tuple]]:
    return {"mel": mel_mod.param_shapes(cfg.mel),
            "perception": perception_weights.param_shapes(cfg.perception),
            "rnnt": rnnt_mod.param_shapes(cfg.rnnt),
            "thinker": thinker_weights.param_shapes(cfg.thinker),
            "talker": talker_weights.param_shapes(cfg.talker),
            "codec": codec_mod.param_shapes(cfg.codec)}


def layout(cfg: VoiceChatConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """name → (shape, owning network) for every checkpoint tensor."""
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for net, shapes in _sources(cfg).items():
        for name, shape in shapes.items():
            if name in out:
                raise AssertionError(f"{name} claimed by {out[name][1]} and {net}")
            out[name] = (tuple(shape), net)
    return out


def param_shapes(cfg: VoiceChatConfig) -> dict[str, tuple[int, ...]]:
    return {name: shape for name, (shape, _) in layout(cfg).items()}


def integer_names(cfg: VoiceChatConfig) -> frozenset[str]:
    """Tensors stored and loaded as int32 (talker flag tables, silence and control codes)."""
    return talker_weights.integer_buffers(cfg.talker)


def parameter_counts(cfg: VoiceChatConfig) -> dict[str, int]:
    """Elements per network (integer buffers included) and 'total', from shapes only."""
    counts = dict.fromkeys(NETWORKS, 0)
    for shape, net in layout(cfg).values():
        counts[net] += math.prod(shape)
    counts["total"] = sum(counts.values())
    return counts


def load_dtype(cfg: VoiceChatConfig, profile: Profile) -> Callable[[str], torch.dtype]:
    """name → the dtype it is cast to when loaded under `profile` (docs/MODEL.md §4, §7)."""
    owner = {name: net for name, (_, net) in layout(cfg).items()}
    ints = integer_names(cfg)

    def dtype(name: str) -> torch.dtype:
        if name in ints:
            return torch.int32
        return profile.compute if owner[name] in ("perception", "thinker") else torch.float32
    return dtype


def random_weights_on(cfg: VoiceChatConfig, device: torch.device | str = "cpu", seed: int = 0,
                      dtype_of: Callable[[str], torch.dtype] | None = None) -> dict[str, Tensor]:
    """A checkpoint-shaped dict of §8 random weights drawn on `device`: fp32 with int32 integer
    buffers, or each tensor cast by `dtype_of` (e.g. `load_dtype(cfg, profile)`) as soon as its
    network is drawn, so the full model never sits on the device in fp32 at once. Each network
    draws from its own generator seeded from (seed, network), so a network's weights do not
    depend on the others' sizes. The draws depend on the device's generator: the CPU gives the
    reference weights (`random_weights`), a GPU its own."""
    inits = {"mel": mel_mod.init_random, "perception": perception_weights.init_random,
             "rnnt": rnnt_mod.init_random, "thinker": thinker_weights.init_random,
             "talker": talker_weights.init_random, "codec": codec_mod.init_random}
    configs = {"mel": cfg.mel, "perception": cfg.perception, "rnnt": cfg.rnnt,
               "thinker": cfg.thinker, "talker": cfg.talker, "codec": cfg.codec}
    ints = integer_names(cfg)
    cast = dtype_of or (lambda name: torch.int32 if name in ints else torch.float32)
    device = torch.device(device)
    out: dict[str, Tensor] = {}
    with device:
        for i, net in enumerate(NETWORKS):
            g = torch.Generator(device=device).manual_seed(seed * len(NETWORKS) + i)
            drawn = inits[net](configs[net], g)
            for name in list(drawn):
                out[name] = drawn.pop(name).to(device=device, dtype=cast(name)).contiguous()
    return out


def random_weights(cfg: VoiceChatConfig, seed: int = 0) -> dict[str, Tensor]:
    """The reference random weights: `random_weights_on` the CPU, fp32 / int32."""
    return random_weights_on(cfg, "cpu", seed)
