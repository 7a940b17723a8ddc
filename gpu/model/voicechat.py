"""The whole duplex model (docs/MODEL.md §1): five networks run per 80 ms frame, batched over sessions.

Algorithm, one frame for B sessions in `slots` (each at its own position):
  mel        1280 samples → the 17-column window                       (fp32)
  perception window → e_t [B, d_model], a_t = proj(e_t) [B, hidden]    (profile compute dtype)
  RNNT       e_t → user tokens [B, 10] (−1 padded), turn signals        (fp32)
  AddFusion  x_t = 1·E[y_{t−1}] + 1·a_t + 2·E[f_{t−1}]; a forced function token (tool result,
             §6) replaces f_{t−1} and the text input y_{t−1} becomes PAD for that frame
  thinker    x_t → greedy y_t, f_t                                      (compute dtype, SSM fp32)
  talker     y_t, previous codes, explicit noise → 31 codes; idle = outside an assistant turn
             (no BOS yet, or after its EOS), which turns PAD into silence (§2.5 rules)
  codec      silence-substituted codes → 1764 samples at 22.05 kHz      (fp32)
Then y_t, f_t are kept as the next frame's y_{t−1}, f_{t−1}; the outputs are the model's own
tokens even on forced frames (only the inputs are forced).

The step is static: fixed shapes for a given B, no host synchronisation, no Python loop over
sessions, state changed only by index writes at `slots`, noise an input. Session start runs
outside it: `prefill_chunk` (the system prompt into the thinker, a bounded chunk at a time) and
the talker's 37 Aria warm-up positions, which are the same for every session: `warmup_chunk`
runs them, `warm` copies them in from one run of them (`warm_template`). Weights are loaded by checkpoint name only
(`load`), from a real file (checkpoint.py) or from §8 random draws under the same names.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Mapping

import torch
from torch import Tensor, nn

from gpu.model.codec import Codec, load_codec
from gpu.model.config import Profile, VoiceChatConfig
from gpu.model.mel import MelFrontEnd
from gpu.model.perception import Perception, PerceptionOutput
from gpu.model.rnnt import RNNT, RNNTOutput
from gpu.model.talker.state import TalkerInputs, TalkerOutput, TalkerState, roll_turn
from gpu.model.talker.talker import Talker
from gpu.model.talker.text import CharTable
from gpu.model.talker.weights import load_talker
from gpu.model.thinker import Thinker
from wave_actors.core.text import BOS, EOS, PAD
from gpu.model.voicechat_noise import FrameNoise
from gpu.model.voicechat_state import VoiceChatState
from gpu.model.voicechat_weights import load_dtype, param_shapes, random_weights
from gpu.model.slots import fill_slots


@dataclass
class FrameOutput:
    pcm: Tensor      # fp32 [B, 1764] at 22.05 kHz
    text: Tensor     # int64 [B]: y_t
    func: Tensor     # int64 [B]: f_t
    user: Tensor     # int64 [B, 10]: RNNT pieces, −1 padded
    codes: Tensor    # int64 [B, Q]: the talker's generated codes (before silence substitution)
    bou: Tensor      # bool [B]: the user began an utterance this frame
    eou: Tensor      # bool [B]: the user's utterance ended this frame


@dataclass
class Thought:
    text: Tensor     # int64 [B]: y_t
    func: Tensor     # int64 [B]: f_t
    idle: Tensor     # bool [B]: outside an assistant turn (the talker turns PAD into silence)


@contextlib.contextmanager
def _no_meta_draws():
    """Build modules on the meta device without drawing their initial weights (`load` assigns
    every tensor): torch's meta `normal_` (nn.Embedding's init) imports torch._dynamo on first
    use, seconds of start-up for nothing. Construction is single-threaded and restores the hook."""
    saved = torch.nn.init.normal_
    torch.nn.init.normal_ = lambda tensor, *args, **kwargs: tensor
    try:
        yield
    finally:
        torch.nn.init.normal_ = saved


class VoiceChat(nn.Module):
    """All five networks (plus the mel front end) on one device. Built on the meta device (no
    memory); `load` assigns real tensors cast to the profile's dtypes on `device`."""

    def __init__(self, cfg: VoiceChatConfig, profile: Profile, device: torch.device | str = "cpu",
                 char_table: CharTable | None = None):
        super().__init__()
        self.cfg, self.profile, self.device = cfg, profile, torch.device(device)
        self._roll_turns: dict[int, tuple[Tensor, Tensor]] = {}     # drop → `roll_turn` tables
        self._warm: dict[tuple, tuple[Tensor, Tensor]] = {}         # cache layout → warm K/V
        self.talker_kv_scale: Tensor | None = None      # fp8 talker KV: from the weights, at load
        meta, cd = torch.device("meta"), profile.compute
        with _no_meta_draws():
            self.mel = MelFrontEnd(cfg.mel, device=meta)
            self.perception = Perception(cfg.perception, device=meta, dtype=cd)
            self.rnnt = RNNT(cfg.rnnt, device=meta, dtype=torch.float32)
            self.thinker = Thinker(cfg.thinker, device=meta, dtype=cd)
            with meta:
                self.talker = Talker(cfg.talker, char_table)    # its char table stays on the CPU
                self.codec = Codec(cfg.codec)

    @classmethod
    def random(cls, cfg: VoiceChatConfig, profile: Profile, device: torch.device | str = "cpu",
               seed: int = 0, char_table: CharTable | None = None) -> "VoiceChat":
        model = cls(cfg, profile, device, char_table)
        model.load(random_weights(cfg, seed))
        return model

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def load(self, tensors: Mapping[str, Tensor]) -> None:
        """Assign every network's tensors (exactly the checkpoint names; extra names ignored, a
        missing or mis-shaped one raises) cast to the profile dtype on the model's device."""
        dtype_of = load_dtype(self.cfg, self.profile)
        moved = {n: tensors[n].to(device=self.device, dtype=dtype_of(n)) for n in param_shapes(self.cfg)
                 if n in tensors}
        for net in (self.mel, self.perception, self.rnnt, self.thinker):
            net.load_named(moved)
        load_talker(self.talker, moved)
        load_codec(self.codec, moved)
        self.talker.to(self.device)                         # the non-persistent char table
        self._warm.clear()
        if self.profile.talker_kv == torch.float8_e4m3fn:
            self.talker_kv_scale = self.talker.kv_scales(self.profile.cfg_rows)

    def alloc_state(self, max_slots: int, max_context: int, max_prompt: int = 0) -> VoiceChatState:
        """State for `max_slots` sessions with the RNNT start rows of these weights (re-allocate
        after loading other weights)."""
        return VoiceChatState.alloc(self.cfg, self.profile, max_slots, max_context, self.device,
                                    max_prompt, self.rnnt.start_rows(), self.talker_kv_scale)

    @torch.no_grad()
    def roll(self, state: VoiceChatState, slot: int, thinker_sink: int, drop: int) -> None:
        """A session at the end of its context drops its `drop` oldest frames from the thinker's
        and the talker's KV caches, keeping its first `thinker_sink` thinker positions (the
        system prompt) and the talker's warm-up as sinks; every other state (Mamba, perception
        ring, RNNT, codec) is bounded already and carries on."""
        state.thinker.roll(slot, thinker_sink, drop)
        turn = self._roll_turns.get(drop)
        if turn is None:
            turn = self._roll_turns[drop] = roll_turn(self.cfg.talker, drop, self.device)
        state.talker.roll(slot, self.cfg.talker.n_warmup, drop, turn)

    def noise(self, seed: int, session: Tensor, frame: Tensor) -> FrameNoise:
        """The talker noise of frame `frame[b]` of session `session[b]` (see voicechat_noise)."""
        return FrameNoise.for_talker(self.cfg.talker, seed, session.to(self.device), frame.to(self.device))

    @torch.no_grad()
    def step(self, state: VoiceChatState, audio: Tensor, slots: Tensor, noise: FrameNoise,
             forced_func: Tensor) -> FrameOutput:
        """One frame for the sessions at `slots` [B]: audio fp32 [B, 1280] (16 kHz), noise for
        [B] rows, forced_func int [B] (a tool-result token to force as f_{t−1}, −1 for none).
        Advances those slots' state; other slots are untouched: `frames` for one frame (the
        stages below, in order); the engine runs them on several CUDA streams (beat_streams.py)."""
        out: list[FrameOutput] = []
        self.frames(state, audio[:, None], slots, lambda f: noise, forced_func[:, None],
                    lambda f, o: out.append(o))
        return out[0]

    @torch.no_grad()
    def frames(self, state: VoiceChatState, audio: Tensor, slots: Tensor, noise_of, forced: Tensor,
               emit) -> None:
        """F consecutive frames (a beat) on one stream: audio [B, F, 1280], forced [B, F],
        noise_of(f) → frame f's FrameNoise, emit(f, FrameOutput) takes each frame's outputs.
        Both frames are heard first (hear_frames); the rest runs frame by frame as in `step`."""
        for f, heard in enumerate(self.hear_frames(state, audio, slots)):
            asr = self.transcribe(state, heard, slots)
            th = self.think(state, heard, slots, forced[:, f])
            spoken = self.speak(state, th, noise_of(f), slots)
            pcm = self.decode(state, spoken, slots)
            emit(f, FrameOutput(pcm, th.text, th.func, asr.tokens, spoken.codes, asr.bou, asr.eou))

    # -- the stages of a frame. Each touches only its own networks' state, so stages of different
    # frames may overlap where their inputs allow: hear(t+1) does not wait for think(t), speak(t)
    # and think(t+1) are independent, and nothing waits for transcribe. Hearing a beat's frames
    # together (hear_frames) reads perception's weights once for both.
    def hear_frames(self, state: VoiceChatState, audio: Tensor, slots: Tensor) -> list[PerceptionOutput]:
        """Mel and perception for F consecutive frames, audio [B, F, 1280], with perception's
        weights read once for all F (Perception.step_frames); one output per frame."""
        windows = torch.stack([self.mel.step(state.mel, audio[:, f], slots).window
                               for f in range(audio.shape[1])], dim=1)
        heard = self.perception.step_frames(state.perception, windows, slots)
        return [heard.frame(f) for f in range(audio.shape[1])]

    def transcribe(self, state: VoiceChatState, heard: PerceptionOutput, slots: Tensor) -> RNNTOutput:
        return self.rnnt.step(state.rnnt, heard.enc, slots)

    def think(self, state: VoiceChatState, heard: PerceptionOutput, slots: Tensor, forced_func: Tensor) -> Thought:
        """The thinker's tokens, and the turn bookkeeping the talker needs (`Thought.idle`).
        text_prev, func_prev and speaking are read and written here only."""
        forced = forced_func >= 0
        text_in = torch.where(forced, PAD, state.text_prev[slots])
        func_in = torch.where(forced, forced_func.long(), state.func_prev[slots])
        th = self.thinker.step(state.thinker, heard.audio, text_in, func_in, slots)
        y = th.text
        speaking = state.speaking[slots]
        idle = ~(speaking | (y == BOS))
        state.text_prev[slots] = y
        state.func_prev[slots] = th.func
        state.speaking[slots] = (speaking | (y == BOS)) & (y != EOS)
        return Thought(y, th.func, idle)

    def speak(self, state: VoiceChatState, th: Thought, noise: FrameNoise, slots: Tensor) -> TalkerOutput:
        return self.talker.step(state.talker, TalkerInputs(th.text, noise.uniforms, noise.normals,
                                                           th.idle), slots)

    def decode(self, state: VoiceChatState, spoken: TalkerOutput, slots: Tensor) -> Tensor:
        return self.codec.step(state.codec, spoken.codec_codes, slots)

    @torch.no_grad()
    def prefill_chunk(self, state: VoiceChatState, slots: Tensor, tokens: Tensor, n_valid: Tensor) -> None:
        """The next C positions of each slot's system prompt: tokens int [B, C], the first
        n_valid[b] of row b real (0 allowed). The caller splits [bos] + prompt + [eos] into chunks
        and keeps each slot within `state.max_prompt` positions."""
        self.thinker.prefill(state.thinker, tokens.long(), n_valid.long(), slots)

    @torch.no_grad()
    def warm_template(self, talker: TalkerState) -> tuple[Tensor, Tensor]:
        """The warm-up's K/V rows [L, R, kv, n_warmup, dh] for caches laid out as `talker`'s:
        its inputs are fixed (the Aria latents, PAD then EOS text, positions 0…n_warmup − 1),
        so every session's warm-up leaves the same rows. Run once (one slot, all positions in
        one call, as the reference start does) and kept."""
        n, k = self.cfg.talker.n_warmup, talker.k
        key = (k.dtype, tuple(k.shape[1:4]), k.shape[5])
        if key not in self._warm:
            one = dataclasses.replace(
                talker, k=k.new_zeros(1, *k.shape[1:4], n, k.shape[5]),
                v=k.new_zeros(1, *k.shape[1:4], n, k.shape[5]),
                position=talker.position.new_zeros(1), prev_codes=talker.prev_codes[:1].clone())
            self.talker.warmup(one, torch.zeros(1, dtype=torch.long, device=k.device), n)
            self._warm[key] = (one.k[0], one.v[0])
        return self._warm[key]

    @torch.no_grad()
    def warm(self, state: VoiceChatState, slots: Tensor) -> None:
        """The talker's warm-up into freshly reset `slots`: copied from `warm_template`, so a
        session's start is only its prompt (index writes, no host synchronisation)."""
        k, v = self.warm_template(state.talker)
        n = k.shape[3]
        state.talker.k[slots, :, :, :, :n] = k
        state.talker.v[slots, :, :, :, :n] = v
        fill_slots(state.talker.position, slots, n)

    @torch.no_grad()
    def warmup_chunk(self, state: VoiceChatState, slots: Tensor, count: int) -> None:
        """The next `count` talker warm-up positions of every slot in `slots`; the caller keeps
        position + count ≤ n_warmup for each (group slots by their remaining count)."""
        self.talker.warmup(state.talker, slots, count)
