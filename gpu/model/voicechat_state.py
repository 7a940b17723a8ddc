"""Per-session state of the whole pipeline (docs/MODEL.md §3): one dataclass of preallocated,
slot-indexed tensors, `reset(slots)` by masked writes, and its bytes per session counted from the
allocated shapes themselves.

Sizing. The thinker holds `max_prompt + max_context` positions (system prompt, then one per frame)
plus its trash row; the talker `n_warmup + max_context` (the Aria warm-up, then one per frame).
A session must end before it runs `max_context` frames: the step never checks (a check would
synchronise), the caller counts frames on the host.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor

from gpu.model.codec import CodecState
from gpu.model.config import Profile, VoiceChatConfig
from gpu.model.mel import MelState
from gpu.model.perception import PerceptionState
from gpu.model.rnnt import RNNTState
from gpu.model.talker.state import TalkerState
from gpu.model.thinker import ThinkerState
from wave_actors.core.text import PAD
from gpu.model.slots import fill_slots

SHARED = frozenset({"rnnt.start_h", "rnnt.start_c", "rnnt.start_g",   # not per slot
                    "talker.kv_scale"})


def _rnnt_state(cfg: VoiceChatConfig, max_slots: int, device, start) -> RNNTState:
    """RNNTState without a model: `start` = (g, h, c) of a fresh session (zeros until the weights
    are known; `VoiceChat.alloc_state` passes the primed rows)."""
    r = cfg.rnnt
    if start is None:
        start = (torch.zeros(r.pred_dim, device=device),
                 torch.zeros(r.lstm_layers, r.pred_dim, device=device),
                 torch.zeros(r.lstm_layers, r.pred_dim, device=device))
    g0, h0, c0 = (t.to(device=device, dtype=torch.float32) for t in start)
    long = lambda: torch.zeros(max_slots, dtype=torch.long, device=device)
    return RNNTState(h0.expand(max_slots, -1, -1).clone(), c0.expand(max_slots, -1, -1).clone(),
                     g0.expand(max_slots, -1).clone(), long(), long(),
                     torch.zeros(max_slots, dtype=torch.bool, device=device), long(), h0, c0, g0)


@dataclass
class VoiceChatState:
    """Everything a session carries between frames. Invariants: after reset, prefill and warm-up,
    text_prev = func_prev = PAD, speaking False, talker position = n_warmup; after each frame
    text_prev / func_prev hold y_t / f_t (AddFusion reads them as y_{t−1}, f_{t−1})."""
    mel: MelState
    perception: PerceptionState
    rnnt: RNNTState
    thinker: ThinkerState
    talker: TalkerState
    codec: CodecState
    text_prev: Tensor     # int64 [S]: y_{t−1}
    func_prev: Tensor     # int64 [S]: f_{t−1}
    speaking: Tensor      # bool [S]: inside an assistant turn (a BOS seen, its EOS not yet)
    profile: Profile
    max_context: int      # frames a session may run
    max_prompt: int       # system-prompt positions ([bos] + prompt + [eos]) a session may hold

    @classmethod
    def alloc(cls, cfg: VoiceChatConfig, profile: Profile, max_slots: int, max_context: int,
              device: torch.device | str = "cpu", max_prompt: int = 0,
              rnnt_start: tuple[Tensor, Tensor, Tensor] | None = None,
              talker_kv_scale: Tensor | None = None) -> "VoiceChatState":
        cd = profile.compute
        talker = TalkerState.alloc(cfg.talker, max_slots, cfg.talker.n_warmup + max_context, device,
                                   profile.talker_profile, kv_dtype=profile.talker_kv,
                                   kv_scale=talker_kv_scale)
        long = lambda fill: torch.full((max_slots,), fill, dtype=torch.long, device=device)
        return cls(MelState.alloc(cfg.mel, max_slots, device),
                   PerceptionState.alloc(cfg.perception, max_slots, device, dtype=cd),
                   _rnnt_state(cfg, max_slots, device, rnnt_start),
                   ThinkerState.alloc(cfg.thinker, max_slots, max_prompt + max_context, device,
                                      dtype=cd, ssm_dtype=profile.ssm,
                                      ssm_round=profile.ssm_round),
                   talker, CodecState.alloc(cfg.codec, max_slots, device),
                   long(PAD), long(PAD), torch.zeros(max_slots, dtype=torch.bool, device=device),
                   profile, max_context, max_prompt)

    @property
    def max_slots(self) -> int:
        return self.text_prev.shape[0]

    def reset(self, slots: Tensor | slice, thinker: bool = True) -> None:
        """A fresh session in `slots` (index writes only; other slots untouched): an index
        tensor, or a slice of consecutive slots (plain fills of views, no index kernels).
        `thinker=False` leaves the thinker's part to a prompt snapshot copied in next, which
        writes all of it."""
        parts = (self.mel, self.perception, self.rnnt, self.talker, self.codec)
        for part in parts + ((self.thinker,) if thinker else ()):
            part.reset(slots)
        fill_slots(self.text_prev, slots, PAD)
        fill_slots(self.func_prev, slots, PAD)
        fill_slots(self.speaking, slots, False)

    def window(self, thinker_positions: int, talker_positions: int) -> "VoiceChatState":
        """The same state with the thinker and talker KV caches cut to their first positions (views:
        writes land in this state). For eager backends only, whose attention cost otherwise grows
        with the allocated, not the used, context. The caller guarantees every session it steps
        through the window writes below those lengths: thinker length + chunk ≤ thinker_positions,
        talker position + count ≤ talker_positions. The thinker's trash row becomes row
        `thinker_positions` of the full cache: beyond every session in the call, so masked prefill
        positions may scribble there and a session overwrites it before reading it. Masked keys contribute
        exact zeros, so results match the full state to the last bit up to the reduction order
        of the BLAS kernels (observed identical on the CPU; the tests compare)."""
        th, tk = self.thinker, self.talker
        if not (0 < thinker_positions <= th.max_positions and 0 < talker_positions <= tk.max_positions):
            raise ValueError(f"window ({thinker_positions}, {talker_positions}) outside the state")
        thinker = dataclasses.replace(th, k=th.k[:, :, :thinker_positions + 1],
                                      v=th.v[:, :, :thinker_positions + 1])
        talker = dataclasses.replace(tk, k=tk.k[:, :, :, :, :talker_positions],
                                     v=tk.v[:, :, :, :, :talker_positions])
        return dataclasses.replace(self, thinker=thinker, talker=talker)

    def tensors(self) -> Iterator[tuple[str, Tensor]]:
        """('part.field', tensor) for every tensor the state holds (lists flattened)."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                yield f.name, value
            elif dataclasses.is_dataclass(value) and not isinstance(value, Profile):
                for g in dataclasses.fields(value):
                    sub = getattr(value, g.name)
                    items = sub if isinstance(sub, list) else [sub]
                    for i, t in enumerate(items):
                        if isinstance(t, Tensor):
                            yield f"{f.name}.{g.name}" + (f".{i}" if isinstance(sub, list) else ""), t

    def slot_bytes(self) -> dict[str, int]:
        """Bytes per session of every per-slot tensor (all but the shared RNNT start rows)."""
        return {name: t.numel() * t.element_size() // self.max_slots
                for name, t in self.tensors() if name not in SHARED}


def session_state_bytes(cfg: VoiceChatConfig, profile: Profile, context: int,
                        prompt: int = 0) -> dict[str, int]:
    """Bytes one session holds at `context` frames (+ `prompt` thinker positions), from the shapes
    of a one-slot state allocated on the meta device; per tensor and 'total'."""
    per = VoiceChatState.alloc(cfg, profile, 1, context, "meta", max_prompt=prompt).slot_bytes()
    return per | {"total": sum(per.values())}
