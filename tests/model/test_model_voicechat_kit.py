"""Shared helpers of the whole-model tests (no tests here): deterministic prompts, audio and
frames on the tiny config, and session start (prefill and warm-up) in chosen chunk sizes."""
from __future__ import annotations

import torch

from gpu.model.config import Profile, VoiceChatConfig
from wave_actors.core.text import BOS, EOS
from gpu.model.voicechat import FrameOutput, VoiceChat

CFG = VoiceChatConfig.tiny()
FP32 = Profile.named("fp32")
NOISE_SEED = 11


def prompt(seed: int, n: int) -> list[int]:
    """[bos] + n byte-fallback-range tokens + [eos]."""
    g = torch.Generator().manual_seed(seed)
    return [BOS] + torch.randint(1000, 1256, (n,), generator=g).tolist() + [EOS]


def start(model: VoiceChat, state, slots: list[int], prompts: list[list[int]], chunk: int = 64,
          warm: int | None = None) -> None:
    """Reset `slots`, prefill their prompts together in chunks of `chunk` (ragged: a finished row
    gets n_valid 0), then run the talker warm-up in chunks of `warm` (all at once by default)."""
    dev = state.text_prev.device
    idx = torch.tensor(slots, device=dev)
    state.reset(idx)
    done = [0] * len(slots)
    while any(d < len(p) for d, p in zip(done, prompts)):
        tokens = torch.full((len(slots), chunk), 12)
        n_valid = torch.zeros(len(slots), dtype=torch.long)
        for b, p in enumerate(prompts):
            part = p[done[b]:done[b] + chunk]
            tokens[b, :len(part)] = torch.tensor(part, dtype=torch.long)
            n_valid[b] = len(part)
            done[b] += len(part)
        model.prefill_chunk(state, idx, tokens.to(dev), n_valid.to(dev))
    n, warm = model.cfg.talker.n_warmup, warm or model.cfg.talker.n_warmup
    for at in range(0, n, warm):
        model.warmup_chunk(state, idx, min(warm, n - at))


def audio(session: int, frame: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * session + frame)
    return 0.1 * torch.randn(1280, generator=g)


def frame(model: VoiceChat, state, slots: list[int], sessions: list[int], t: list[int] | int,
          forced: list[int] | None = None) -> FrameOutput:
    """One frame for `slots`; session `sessions[b]` at its own frame `t[b]` (audio and noise keyed
    by (session, frame), so a session sees the same inputs in any batch)."""
    ts = [t] * len(slots) if isinstance(t, int) else t
    dev = state.text_prev.device
    x = torch.stack([audio(s, f) for s, f in zip(sessions, ts)]).to(dev)
    noise = model.noise(NOISE_SEED, torch.tensor(sessions), torch.tensor(ts))
    f = torch.tensor(forced if forced is not None else [-1] * len(slots), device=dev)
    return model.step(state, x, torch.tensor(slots, device=dev), noise, f)


def row(o: FrameOutput, b: int) -> dict:
    return {"pcm": o.pcm[b], "text": o.text[b], "func": o.func[b], "user": o.user[b],
            "codes": o.codes[b]}


def assert_rows_equal(a: dict, b: dict, atol: float = 1e-5) -> None:
    for k in ("text", "func", "user", "codes"):
        assert torch.equal(a[k], b[k]), (k, a[k], b[k])
    assert torch.allclose(a["pcm"], b["pcm"], atol=atol, rtol=0), (a["pcm"] - b["pcm"]).abs().max()
