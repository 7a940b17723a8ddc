"""Teacher-forced fidelity: how far each stage of a serving model (a precision profile, with the
engine's Triton decode ops installed) is from the fp32 reference, on one token history.

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
`VoiceChat.step` exactly (tests/test_fidelity.py checks it). No tool-result forcing.

Errors, per quantity over all frames and sessions (fp32 arithmetic, the tested value vs the
reference's): rel_max = max|test − ref| / max|ref| (the headline), rel_l2 = ‖test − ref‖₂ / ‖ref‖₂,
and rel_max per frame (drift). Quantities: mel.window; perception.enc (e_t), perception.audio (a_t);
rnnt.logits (the joint's logits at the symbol steps the reference reached: up to and including
its blank); thinker.hidden (norm_f output), thinker.text_logits, thinker.func_logits;
talker.hidden (backbone output per CFG row), talker.mog_logits (mixture logits at each unmasking
step), talker.latent (the sampled latent z), talker.rvq_scores (‖e‖² − 2·r·e per code of each
emitted codebook); codec.pcm.

Top-1 agreement (logits quantities): the tested model's own choice (its argmax; for the mixture,
its `MogHead.choose`, the Triton kernel when installed; for the codes, its argmin) against the
reference's, counted only where the reference's decision margin (best minus second-best score:
logits; for the mixture the top-p-filtered logits plus the Gumbel noise; for the codes −score)
exceeds a FIXED bound tol × max|reference row| (raw logits, or scores), tol by the precision
the tested stage computes in: 1e-5 fp32, 1e-3 TF32 (fp32 weights, TF32 matmul on a GPU),
1e-2 bf16 (perception and thinker in the serving profiles; the talker when its KV is bf16);
with `chain`, RNNT and thinker take the coarser of theirs and perception's.
`agree` is over the counted rows, `agree_all` over all, `counted` the fraction counted.

The reference must be the fp32 counterpart of the tested profile with the same number of talker
CFG rows (`reference_profile`: fp32 for `reference`, fp32-dense for `dense`, which runs CFG off:
comparing with CFG on would measure the guidance, not the precision). TF32 is switched off
while the reference runs and set to the tested profile's flag while the tested model runs.
Torch only; CPU (tiny config, kernels in Triton's interpreter or not installed) and CUDA.
"""
from __future__ import annotations

import contextlib
import time
from typing import Iterator

import torch
from torch import Tensor

from gpu.model.config import Profile, VoiceChatConfig
from gpu.model.talker_mog import GUMBEL_EPS, top_p_filter
# The special token ids as voicechat.py imports them (their module is being moved).
from gpu.model.voicechat import BOS, EOS, PAD, VoiceChat
from gpu.model.voicechat_weights import random_weights_on

QUANTITIES = {              # quantity → stage
    "mel.window": "mel",
    "perception.enc": "perception", "perception.audio": "perception",
    "rnnt.logits": "rnnt",
    "thinker.hidden": "thinker", "thinker.text_logits": "thinker", "thinker.func_logits": "thinker",
    "talker.hidden": "talker", "talker.mog_logits": "talker", "talker.latent": "talker",
    "talker.rvq_scores": "talker",
    "codec.pcm": "codec",
}
ERROR_METRIC = ("rel_max = max|test - ref| / max|ref| over all frames and sessions; "
                "rel_l2 = ||test - ref||_2 / ||ref||_2")
AGREEMENT_RULE = ("top-1 of the tested model's own choice vs the reference's, counted where the "
                  "reference's margin (best - second best score) > tol * max|reference row|; tol by "
                  "the tested stage's precision: fp32 1e-5, TF32 1e-3, bf16 1e-2")
TOL = {"fp32": 1e-5, "tf32": 1e-3, "bf16": 1e-2}


def reference_profile(profile: Profile) -> Profile:
    """The fp32 profile to compare `profile` with: same talker CFG rows, everything fp32."""
    return Profile.named("fp32" if profile.cfg_rows == 2 else "fp32-dense")


def stage_precision(profile: Profile, stage: str, device: torch.device, chain: bool = False) -> str:
    """'bf16', 'tf32' or 'fp32': the precision the stage computes in under `profile` (docs/MODEL.md §4);
    with `chain`, the coarser of that and its continuous input's (RNNT and thinker read perception)."""
    if chain and stage in ("rnnt", "thinker"):
        own, upstream = (stage_precision(profile, s, device) for s in (stage, "perception"))
        return max(own, upstream, key=("fp32", "tf32", "bf16").index)
    if stage in ("perception", "thinker"):
        dtype = profile.compute
    elif stage == "talker":
        dtype = profile.talker_kv
    else:
        dtype = torch.float32
    if dtype != torch.float32:
        return "bf16"
    return "tf32" if profile.tf32 and torch.device(device).type == "cuda" else "fp32"


def build_pair(cfg: VoiceChatConfig, profile: Profile, device: torch.device | str, seed: int = 0,
               kernels: bool = True) -> tuple[VoiceChat, VoiceChat]:
    """(fp32 reference, tested model in `profile`) with the same random weights drawn on `device`
    (on the CPU: `random_weights`); the fp32 tensors are shared, not copied. `kernels` installs
    the engine's Triton decode ops in the tested model (on a CPU set TRITON_INTERPRET=1 before
    triton is first imported)."""
    weights = random_weights_on(cfg, device, seed)
    ref = VoiceChat(cfg, reference_profile(profile), device)
    ref.load(weights)
    test = VoiceChat(cfg, profile, device)
    test.load(weights)
    del weights
    if kernels:
        from gpu.engine.decode_ops import TritonDecodeOps, install
        install(test, TritonDecodeOps())
    return ref, test


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

def inputs(cfg: VoiceChatConfig, sessions: int, frames: int, seed: int = 0,
           prompt_len: int = 8) -> tuple[Tensor, Tensor]:
    """The sessions' prompts int64 [sessions, prompt_len] ([bos] + random tokens + [eos]) and
    audio fp32 [sessions, frames, frame_samples] (0.1·N(0, 1) at 16 kHz), on the CPU, drawn from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    hi = min(cfg.thinker.vocab, 1256)
    prompts = torch.cat([torch.full((sessions, 1), BOS),
                         torch.randint(min(1000, hi - 1), hi, (sessions, prompt_len - 2), generator=gen),
                         torch.full((sessions, 1), EOS)], dim=1)
    return prompts, 0.1 * torch.randn(sessions, frames, cfg.mel.frame_samples, generator=gen)


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
                  seed: int = 0, chain: bool = False, prompt_len: int = 8) -> Iterator[dict]:
    """Yield, for each frame, {"ref": outputs, "test": outputs} (tensors) of the two models run
    teacher-forced on the reference's choices (module docstring). Sessions get a random prompt
    of `prompt_len` tokens, the talker warm-up, then `frames` frames of 0.1·N(0, 1) audio and
    the talker noise of (seed, session, frame): all drawn from `seed`."""
    if model_ref.device != model_test.device:
        raise ValueError(f"models on {model_ref.device} and {model_test.device}")
    if model_ref.profile.cfg_rows != model_test.profile.cfg_rows:
        raise ValueError("reference and tested model differ in talker CFG rows: compare with "
                         "reference_profile(tested profile)")
    cfg, dev = model_ref.cfg, model_ref.device
    prompts, audio = inputs(cfg, sessions, frames, seed, prompt_len)
    audio = audio.to(dev)
    ref_tf32, test_tf32 = False, model_test.profile.tf32
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
            y, f = r["thinker"]["text"], r["thinker"]["func"]
            idle = ~(speaking | (y == BOS))
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
            d["talker"] = _talker(model_test.talker, st_t.talker, y, idle, noise, slots, r["talker"])
            d["pcm"] = model_test.codec.step(st_t.codec, r["talker"]["codec_codes"], slots)
        text_prev, func_prev = y, f
        speaking = (speaking | (y == BOS)) & (y != EOS)
        for st in (st_r, st_t):             # VoiceChat.think's bookkeeping, the reference's tokens
            st.text_prev[slots], st.func_prev[slots], st.speaking[slots] = y, f, speaking
        yield {"ref": r, "test": d}


# ---------------------------------------------------------------------------------- measuring

class _Error:
    def __init__(self):
        self.max_err = self.max_ref = self.sq_err = self.sq_ref = 0.0
        self.by_frame: list[float] = []

    def add(self, test: Tensor, ref: Tensor, mask: Tensor | None = None) -> None:
        d, r = test.float() - ref.float(), ref.float()
        if mask is not None:
            d, r = d[mask], r[mask]
        if r.numel() == 0:
            self.by_frame.append(0.0)
            return
        e, m, se, sr = torch.stack([d.abs().max(), r.abs().max(), d.double().square().sum().float(),
                                    r.double().square().sum().float()]).tolist()
        self.max_err, self.max_ref = max(self.max_err, e), max(self.max_ref, m)
        self.sq_err, self.sq_ref = self.sq_err + se, self.sq_ref + sr
        self.by_frame.append(e / m if m else 0.0)

    def result(self) -> dict:
        return {"rel_max": self.max_err / self.max_ref if self.max_ref else 0.0,
                "rel_l2": (self.sq_err / self.sq_ref) ** 0.5 if self.sq_ref else 0.0,
                "max_abs_err": self.max_err, "max_abs_ref": self.max_ref,
                "rel_max_by_frame": [round(v, 8) for v in self.by_frame]}


class _Agreement:
    def __init__(self, tol: float, precision: str):
        self.tol, self.precision = tol, precision
        self.total = self.counted = self.agree = self.agree_all = 0

    def add(self, own: Tensor, ref_choice: Tensor, ref_scores: Tensor, scale: Tensor,
            mask: Tensor | None = None) -> None:
        """own, ref_choice [N...]; ref_scores [N..., V] (higher is better); scale [N...]."""
        top2 = ref_scores.float().topk(2, dim=-1).values
        counted = (top2[..., 0] - top2[..., 1]) > self.tol * scale.float()
        same = own.long() == ref_choice.long()
        if mask is not None:
            counted, same = counted[mask], same[mask]
        total, n, agree, agree_all = torch.stack([
            torch.tensor(same.numel(), device=same.device), counted.sum(), (same & counted).sum(),
            same.sum()]).tolist()
        self.total += total
        self.counted += n
        self.agree += agree
        self.agree_all += agree_all

    def result(self) -> dict:
        return {"precision": self.precision, "tol": self.tol,
                "counted": self.counted / self.total if self.total else 0.0,
                "agree": self.agree / self.counted if self.counted else 1.0,
                "agree_all": self.agree_all / self.total if self.total else 1.0,
                "rows": self.total, "counted_rows": self.counted,
                "disagree_counted": self.counted - self.agree}


def _rowmax(x: Tensor) -> Tensor:
    return x.float().abs().amax(-1)


@torch.no_grad()
def measure(model_ref: VoiceChat, model_test: VoiceChat, sessions: int = 4, frames: int = 16,
            seed: int = 0, chain: bool = False, prompt_len: int = 8) -> dict:
    """Teacher-forced per-stage errors and top-1 agreement of `model_test` against `model_ref`
    (module docstring) over `frames` frames of `sessions` sessions. JSON-ready."""
    t0 = time.perf_counter()
    dev = model_ref.device
    prof = model_test.profile
    err = {name: _Error() for name in QUANTITIES}
    tol = {stage: stage_precision(prof, stage, dev, chain) for stage in dict.fromkeys(QUANTITIES.values())}
    agr = {name: _Agreement(TOL[tol[QUANTITIES[name]]], tol[QUANTITIES[name]])
           for name in ("rnnt.logits", "thinker.text_logits", "thinker.func_logits",
                        "talker.mog_logits", "talker.rvq_scores")}
    for fr in forced_frames(model_ref, model_test, sessions, frames, seed, chain, prompt_len):
        r, d = fr["ref"], fr["test"]
        err["mel.window"].add(d["window"], r["window"])
        err["perception.enc"].add(d["enc"], r["enc"])
        err["perception.audio"].add(d["audio"], r["audio"])
        rr, dr = r["rnnt"], d["rnnt"]
        err["rnnt.logits"].add(dr["logits"], rr["logits"], rr["live"])
        agr["rnnt.logits"].add(dr["own"], rr["own"], rr["logits"], _rowmax(rr["logits"]), rr["live"])
        rt, dt = r["thinker"], d["thinker"]
        err["thinker.hidden"].add(dt["hidden"], rt["hidden"])
        for key, choice in (("text_logits", "text"), ("func_logits", "func")):
            err[f"thinker.{key}"].add(dt[key], rt[key])
            agr[f"thinker.{key}"].add(dt[choice], rt[choice], rt[key], _rowmax(rt[key]))
        rk, dk = r["talker"], d["talker"]
        err["talker.hidden"].add(dk["hidden"], rk["hidden"])
        stack = lambda o, k: torch.stack(o[k])
        err["talker.mog_logits"].add(stack(dk, "mog_logits"), stack(rk, "mog_logits"))
        agr["talker.mog_logits"].add(stack(dk, "mix_own"), stack(rk, "mixture"),
                                     stack(rk, "mix_scores"), _rowmax(stack(rk, "mog_logits")))
        err["talker.latent"].add(stack(dk, "latent"), stack(rk, "latent"))
        err["talker.rvq_scores"].add(stack(dk, "rvq_scores"), stack(rk, "rvq_scores"))
        scores = stack(rk, "rvq_scores")
        agr["talker.rvq_scores"].add(stack(dk, "code_own"), rk["codes"].T, -scores, _rowmax(scores))
        err["codec.pcm"].add(d["pcm"], r["pcm"])
    out = {}
    for name, stage in QUANTITIES.items():
        out[name] = {"stage": stage, **err[name].result()}
        if name in agr:
            out[name]["top1"] = agr[name].result()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return {"config": model_ref.cfg.name, "profile": prof.name,
            "reference_profile": model_ref.profile.name, "device": str(dev),
            "kernels": model_test.thinker.decode_ops is not None, "sessions": sessions,
            "frames": frames, "seed": seed, "chain": chain, "prompt_len": prompt_len,
            "stage_precision": tol, "error_metric": ERROR_METRIC, "agreement_rule": AGREEMENT_RULE,
            "quantities": out, "seconds": round(time.perf_counter() - t0, 2)}


def table(result: dict) -> str:
    """A short per-quantity table of a `measure` result."""
    lines = [f"{'quantity':20} {'prec':5} {'rel_max':>9} {'rel_l2':>9} {'counted':>7} {'agree':>7} "
             f"{'agree_all':>9}"]
    for name, q in result["quantities"].items():
        a = q.get("top1")
        tail = (f"{a['counted']:7.3f} {a['agree']:7.4f} {a['agree_all']:9.4f}" if a
                else f"{'':7} {'':7} {'':9}")
        prec = result["stage_precision"][q["stage"]]
        lines.append(f"{name:20} {prec:5} {q['rel_max']:9.2e} {q['rel_l2']:9.2e} {tail}")
    return "\n".join(lines)
