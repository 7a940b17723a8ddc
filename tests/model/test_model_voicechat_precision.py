"""Precision profiles (docs/MODEL.md §4) on the tiny config with the same weights: the bf16 profiles
run, keep their dtypes, and their deviation from fp32 is measured and printed (`pytest -s`).

Measured: (1) one frame from the same state: relative L2 error of the thinker's text logits and
of a_t, and whether the greedy tokens agree; (2) free running for FRAMES frames: agreement of
text / function tokens and codes, the first frame where they diverge, and the PCM deviation
(bf16 changes the thinker's tokens, and a changed token changes every later frame, so free-
running agreement is a trajectory measure, not a per-op error). `dense` is compared with
`fp32-dense` (both CFG off), so its number is the bf16 talker KV plus the bf16 thinker.
"""
import copy

import pytest
import torch

from gpu.model.config import Profile
from gpu.model.voicechat import VoiceChat
from gpu.model.voicechat_weights import random_weights
from tests.model.test_model_voicechat_kit import CFG, audio, frame, prompt, start

FRAMES = 20
SLOTS, SESSIONS = [0, 1], [1, 2]




@pytest.fixture(scope="module")
def weights(one_thread):
    return random_weights(CFG, seed=2)


def started(weights, profile_name: str):
    model = VoiceChat(CFG, Profile.named(profile_name))
    model.load(weights)
    state = model.alloc_state(2, FRAMES, 32)
    start(model, state, SLOTS, [prompt(51, 9), prompt(52, 14)])
    return model, state


def one_frame_heads(model, state):
    """a_t and the thinker's logits of the next frame, on a copy of the state."""
    s, slots = copy.deepcopy(state), torch.tensor(SLOTS)
    x = torch.stack([audio(k, 0) for k in SESSIONS])
    heard = model.perception.step(s.perception, model.mel.step(s.mel, x, slots).window, slots)
    th = model.thinker.step(s.thinker, heard.audio, s.text_prev[slots], s.func_prev[slots], slots)
    return heard.audio.float(), th


def free_run(model, state):
    outs = [frame(model, state, SLOTS, SESSIONS, t) for t in range(FRAMES)]
    return {k: torch.stack([getattr(o, k) for o in outs], 1) for k in ("pcm", "text", "func", "codes")}


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


def first_diff(a, b) -> int:
    """Frame index of the first disagreement in any row, FRAMES if none."""
    same = (a == b).reshape(a.shape[0], a.shape[1], -1).all(-1).all(0)
    return int((~same).nonzero()[0]) if not same.all() else FRAMES


@pytest.mark.parametrize("name,base", [     # the edit loop runs the dense one
    pytest.param("reference", "fp32", marks=pytest.mark.slow), ("dense", "fp32-dense")])
def test_bf16_profile_runs_and_its_deviation_is_measured(weights, name, base):
    model, state = started(weights, name)
    ref_model, ref_state = started(weights, base)
    assert model.thinker.lm_head.weight.dtype == model.perception.proj.weight.dtype == torch.bfloat16
    assert state.thinker.ssm.dtype == torch.float32 and state.thinker.k.dtype == torch.bfloat16
    assert model.talker.tts_model.embed_code.weight.dtype == torch.float32
    assert model.codec.decoder.layers[0].weight.dtype == torch.float32
    assert state.talker.k.dtype == (torch.float32 if name == "reference" else torch.bfloat16)
    assert state.talker.k.shape[2] == (2 if name == "reference" else 1)

    a, th = one_frame_heads(model, state)
    a_ref, th_ref = one_frame_heads(ref_model, ref_state)
    logit_err, audio_err = rel(th.text_logits, th_ref.text_logits), rel(a, a_ref)
    run, ref = free_run(model, state), free_run(ref_model, ref_state)
    assert all(torch.isfinite(v.float()).all() for v in run.values())
    agree = {k: float((run[k] == ref[k]).float().mean()) for k in ("text", "func", "codes")}
    pcm = run["pcm"] - ref["pcm"]
    report = {"profile": f"{name} vs {base}", "a_t rel err": round(audio_err, 5),
              "text logits rel err": round(logit_err, 5),
              "frame-0 tokens equal": bool(torch.equal(th.text, th_ref.text) and torch.equal(th.func, th_ref.func)),
              **{f"{k} agreement": round(v, 3) for k, v in agree.items()},
              "first divergent text frame": first_diff(run["text"], ref["text"]),
              "first divergent codes frame": first_diff(run["codes"], ref["codes"]),
              "pcm max abs diff": round(float(pcm.abs().max()), 5),
              "pcm rel rms diff": round(rel(run["pcm"], ref["pcm"]), 5)}
    print("\nbf16 deviation:", report)
    assert 0 < audio_err < 0.05 and 0 < logit_err < 0.1      # bf16 really ran, and not wildly off
