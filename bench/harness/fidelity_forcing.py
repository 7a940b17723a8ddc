"""The teacher forcing behind `fidelity.measure`: the two models run frame by frame, the
tested one on the reference's choices (`forced_frames`), on inputs drawn from a seed
(`inputs`).

How it teacher-forces: stage by stage, through the model's own stage methods, with both models
holding their own per-session state (allocated, prefilled and warmed up the same way). Every
frame the reference runs first and free (greedy / sampled from the frame's noise); then each
stage of the tested model gets the REFERENCE's inputs:
  mel         the same audio (each model's own mel state; fp32 in every profile)
  perception  the reference's mel window
  RNNT        the reference's e_t; inside the frame each of the 10 symbol steps feeds the
              reference's token k back (LSTM update, blank ends the frame), so the predictor
              history is the reference's
  thinker     the reference's a_t and its previous text / function tokens y_{t−1}, f_{t−1}
  talker      the reference's y_t and turn flag, its previous codes (`prev_codes` overwritten
              after the frame), and inside the frame the reference's mixture k and RVQ codes at
              every unmasking step (they build the next step's input q)
  codec       the reference's silence-substituted codes
So the two never diverge by a discrete choice, and each stage's error is its own arithmetic
(including its own recurrent state: Mamba SSM and conv, KV caches, perception caches, LSTM,
codec caches, all accumulated in the tested precision over the frames). With `chain=True` the
continuous stage inputs (mel window → perception, e_t → RNNT, a_t → thinker) are the tested
model's own instead, so the errors add up along the pipeline; the discrete inputs stay forced.
The per-frame bookkeeping of `VoiceChat.think` (text_prev / func_prev / speaking) and the bodies of
`RNNT.step` and `Talker.step` (MoG sampling and RVQ included) are restated here around the
networks' own modules (`Thinker._run`/`heads`, `RNNT.joint`/`_predict`/`_turns`, the talker's
embeddings, backbone, `MogHead.guided`/`choose`/`latent`, `Codec.step`), so the installed
kernels run where they run in serving; `forced_frames` with the reference on both sides reproduces
`VoiceChat.step` exactly (tests/engine/test_fidelity.py checks it). No tool-result forcing.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import Tensor

from gpu.model.config import VoiceChatConfig
from gpu.model.talker.mog import GUMBEL_EPS, top_p_filter
from gpu.model.voicechat import VoiceChat
from wave_actors.core.text import BOS, EOS, PAD


@contextlib.contextmanager
def _tf32(enabled: bool):
    cuda, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = cuda, cudnn


# ------------------------------------------------------------------------------ forced stages

def _rnnt(rnnt, st, enc: Tensor, slots: Tensor, forced: Tensor | None) -> dict:
    """`RNNT.step` with the 10 symbol steps' tokens forced to `forced` [10, B] (None: greedy, as
    the model does). Returns the logits [10, B, V], own argmax [10, B], the tokens fed back
    [10, B], the steps reached (live) [10, B] and the frame's tokens [B, 10] (−1 padded)."""
    cfg = rnnt.cfg
    h, c, g = st.h[slots], st.c[slots], st.g[slots]
    f = rnnt.rnnt_joint["enc"](enc.to(g.dtype))
    active = torch.ones(enc.shape[0], dtype=torch.bool, device=enc.device)
    logits, own, fed, live, tokens = [], [], [], [], []
    for i in range(cfg.max_symbols):
        z = rnnt.joint(f, g)
        best = z.argmax(-1)
        k = best if forced is None else forced[i]
        live.append(active)
        active = active & (k != cfg.blank)
        tokens.append(torch.where(active, k, -1))
        logits.append(z), own.append(best), fed.append(k)
        g2, h2, c2 = rnnt._predict(k, h, c)
        g = torch.where(active[:, None], g2, g)
        h = torch.where(active[:, None, None], h2, h)
        c = torch.where(active[:, None, None], c2, c)
    st.h[slots], st.c[slots], st.g[slots] = h, c, g
    tokens = torch.stack(tokens, dim=1)
    rnnt._turns(st, (tokens >= 0).sum(1) > 0, slots)
    return {"logits": torch.stack(logits), "own": torch.stack(own), "fed": torch.stack(fed),
            "live": torch.stack(live), "tokens": tokens}


def _thinker(thinker, st, audio: Tensor, text_in: Tensor, func_in: Tensor, slots: Tensor) -> dict:
    """`Thinker.step`, keeping the final hidden state."""
    x = thinker.fuse(text_in, audio, func_in)[:, None]
    h = thinker._run(st, x, torch.ones_like(slots), slots, decode=True)[:, 0]
    out = thinker.heads(h)
    return {"hidden": h, "text_logits": out.text_logits, "func_logits": out.func_logits,
            "text": out.text, "func": out.func}


def _gumbel(uniforms: Tensor) -> Tensor:
    return -torch.log(-torch.log(uniforms + GUMBEL_EPS) + GUMBEL_EPS)


def _talker(talker, st, y: Tensor, idle: Tensor, noise, slots: Tensor, forced: dict | None) -> dict:
    """`Talker.step` (MoG sampling and RVQ search inline) with the mixture and the codes of
    every unmasking step forced to `forced` (None: sampled, as the model does)."""
    m, cfg = talker.tts_model, talker.cfg
    mog = m.mog_head
    pos = st.position[slots]
    text = m.embed_subword(y, torch.ones(y.shape, device=y.device))
    audio = m.audio_embedding(st.prev_codes[slots])
    x = m.fuse(audio, text, st.rows)[:, :, None]
    h = m.backbone(x, pos[:, None], st, slots)[:, :, 0]                          # [B, R, H]
    q = h.new_zeros(h.shape[0], cfg.latent)
    out = {"hidden": h, "mog_logits": [], "mix_scores": [], "mix_own": [], "mixture": [],
           "latent": [], "rvq_scores": [], "code_own": []}
    codes, first, n = [], 0, 0
    for s, width in enumerate(cfg.schedule):
        if width == 0:
            continue
        g = mog.guided(h + m.embed_code(q)[:, None, :])
        logits = mog.proj_logits(g)
        k_own = mog.choose(logits, noise.uniforms[:, s]).long()
        k = k_own if forced is None else forced["mixture"][n]
        z = mog.latent(g, k, noise.normals[:, s])
        out["mog_logits"].append(logits), out["mix_own"].append(k_own), out["mixture"].append(k)
        out["mix_scores"].append(top_p_filter(logits.float(), cfg.top_p) + _gumbel(noise.uniforms[:, s]))
        out["latent"].append(z)
        r, chosen = z, torch.zeros_like(z)
        for j in range(first, first + width):                       # rvq_search, forced
            book = m.rvq_embs[j]
            dist = torch.addmm(m.rvq_sqnorms[j][None, :], r, book.T, alpha=-2.0)
            c_own = dist.argmin(dim=-1)
            c = c_own if forced is None else forced["codes"][:, j]
            e = book[c]
            r, chosen = r - e, chosen + e
            out["rvq_scores"].append(dist), out["code_own"].append(c_own)
            codes.append(c)
        q, first, n = q + chosen, first + width, n + 1
    codes = torch.stack(codes, dim=-1)                                               # [B, Q]
    prev, codec_codes = talker.substitute(codes, y, idle)
    st.prev_codes[slots] = prev
    st.position[slots] = pos + 1
    out.update(codes=codes, codec_codes=codec_codes)
    return out


# ------------------------------------------------------------------------------- the frames

SPEECH_GAP_S = 2.0      # silence after each pass of the speech: the user waits for an answer


def inputs(cfg: VoiceChatConfig, sessions: int, frames: int, seed: int = 0,
           prompt_len: int = 8, speech: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The sessions' prompts int64 [sessions, prompt_len] ([bos] + random tokens + [eos]) and
    audio fp32 [sessions, frames, frame_samples] at 16 kHz, on the CPU, drawn from `seed`:
    0.1·N(0, 1), or `speech` (fp32 mono samples at 16 kHz) said again and again with
    SPEECH_GAP_S of silence after each pass, each session from another point of it."""
    gen = torch.Generator().manual_seed(seed)
    hi = min(cfg.thinker.vocab, 1256)
    prompts = torch.cat([torch.full((sessions, 1), BOS),
                         torch.randint(min(1000, hi - 1), hi, (sessions, prompt_len - 2), generator=gen),
                         torch.full((sessions, 1), EOS)], dim=1)
    n = cfg.mel.frame_samples
    if speech is None:
        return prompts, 0.1 * torch.randn(sessions, frames, n, generator=gen)
    turn = torch.cat([speech.float().flatten(),
                      torch.zeros(int(SPEECH_GAP_S * cfg.mel.sample_rate))])
    need = frames * n
    audio = torch.empty(sessions, need)
    for k in range(sessions):
        start = k * len(turn) // sessions
        reps = (start + need) // len(turn) + 1
        audio[k] = turn.repeat(reps)[start:start + need]
    return prompts, audio.view(sessions, frames, n)


def _start(model: VoiceChat, sessions: int, frames: int, prompts: Tensor):
    dev = model.device
    state = model.alloc_state(sessions, frames, prompts.shape[1])
    slots = torch.arange(sessions, device=dev)
    state.reset(slots)
    model.prefill_chunk(state, slots, prompts.to(dev),
                        torch.full((sessions,), prompts.shape[1], device=dev))
    model.warmup_chunk(state, slots, model.cfg.talker.n_warmup)
    return state, slots


@torch.no_grad()
def forced_frames(model_ref: VoiceChat, model_test: VoiceChat, sessions: int, frames: int,
                  seed: int = 0, chain: bool = False, prompt_len: int = 8,
                  thinker_only: bool = False, speech: Tensor | None = None) -> Iterator[dict]:
    """Yield, for each frame, {"ref": outputs, "test": outputs} (tensors) of the two models run
    teacher-forced on the reference's choices (module docstring). Sessions get a random prompt
    of `prompt_len` tokens, the talker warm-up, then `frames` frames of audio (`inputs`: noise,
    or `speech`) and the talker noise of (seed, session, frame): all drawn from `seed`. `thinker_only` stops
    each frame after the thinker (no talker or codec outputs): for an option that changes
    nothing after it, whose talker and codec, fed the same tokens, compute the same."""
    if model_ref.device != model_test.device:
        raise ValueError(f"models on {model_ref.device} and {model_test.device}")
    if model_ref.profile.cfg_rows != model_test.profile.cfg_rows:
        raise ValueError("reference and tested model differ in talker CFG rows: compare with "
                         "reference_profile(tested profile)")
    cfg, dev = model_ref.cfg, model_ref.device
    prompts, audio = inputs(cfg, sessions, frames, seed, prompt_len, speech)
    audio = audio.to(dev)
    ref_tf32, test_tf32 = model_ref.profile.tf32, model_test.profile.tf32   # off in fp32 profiles
    with _tf32(ref_tf32):
        st_r, slots = _start(model_ref, sessions, frames, prompts)
    with _tf32(test_tf32):
        st_t, _ = _start(model_test, sessions, frames, prompts)
    text_prev = torch.full((sessions,), PAD, dtype=torch.long, device=dev)
    func_prev = text_prev.clone()
    speaking = torch.zeros(sessions, dtype=torch.bool, device=dev)
    session_ids = torch.arange(sessions, device=dev)
    for t in range(frames):
        noise = model_ref.noise(seed, session_ids, torch.full((sessions,), t, device=dev))
        x = audio[:, t]
        with _tf32(ref_tf32):
            r = {"window": model_ref.mel.step(st_r.mel, x, slots).window}
            heard = model_ref.perception.step(st_r.perception, r["window"], slots)
            r.update(enc=heard.enc, audio=heard.audio)
            r["rnnt"] = _rnnt(model_ref.rnnt, st_r.rnnt, heard.enc, slots, None)
            r["thinker"] = _thinker(model_ref.thinker, st_r.thinker, heard.audio, text_prev, func_prev, slots)
            r["ssm"] = st_r.thinker.ssm                   # as stored: the state carried on
            y, f = r["thinker"]["text"], r["thinker"]["func"]
            idle = ~(speaking | (y == BOS))
            if not thinker_only:
                r["talker"] = _talker(model_ref.talker, st_r.talker, y, idle, noise, slots, None)
                r["pcm"] = model_ref.codec.step(st_r.codec, r["talker"]["codec_codes"], slots)
        with _tf32(test_tf32):
            w = model_test.mel.step(st_t.mel, x, slots).window
            heard = model_test.perception.step(st_t.perception, w if chain else r["window"], slots)
            d = {"window": w, "enc": heard.enc, "audio": heard.audio}
            d["rnnt"] = _rnnt(model_test.rnnt, st_t.rnnt, heard.enc if chain else r["enc"], slots,
                              r["rnnt"]["fed"])
            d["thinker"] = _thinker(model_test.thinker, st_t.thinker, heard.audio if chain else r["audio"],
                                    text_prev, func_prev, slots)
            d["ssm"] = st_t.thinker.ssm
            if not thinker_only:
                d["talker"] = _talker(model_test.talker, st_t.talker, y, idle, noise, slots,
                                      r["talker"])
                d["pcm"] = model_test.codec.step(st_t.codec, r["talker"]["codec_codes"], slots)
        text_prev, func_prev = y, f
        speaking = (speaking | (y == BOS)) & (y != EOS)
        for st in (st_r, st_t):             # VoiceChat.think's bookkeeping, the reference's tokens
            st.text_prev[slots], st.func_prev[slots], st.speaking[slots] = y, f, speaking
        yield {"ref": r, "test": d}
