"""Teacher-forced fidelity: how far each stage of a serving model (a precision profile, with the
engine's Triton decode ops installed) is from the fp32 reference, on one token history.

How it teacher-forces: `fidelity_forcing`.

Errors, per quantity over all frames and sessions (fp32 arithmetic, the tested value vs the
reference's): rel_max = max|test − ref| / max|ref| (the headline), rel_l2 = ‖test − ref‖₂ / ‖ref‖₂,
and rel_max per frame (drift). Quantities: mel.window; perception.enc (e_t), perception.audio (a_t);
rnnt.logits (the joint's logits at the symbol steps the reference reached: up to and including
its blank); thinker.hidden (norm_f output), thinker.text_logits, thinker.func_logits,
thinker.ssm (the Mamba SSM state as stored after the frame);
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
comparing with CFG on would measure the guidance, not the precision), or a serving profile
the tested one is an option on (`build_pair(against=...)`: dense for dense-ssm16). TF32 is set
to each model's profile flag while it runs (off in the fp32 profiles).
Torch only; CPU (tiny config, kernels in Triton's interpreter or not installed) and CUDA.
"""
from __future__ import annotations

import time

import torch
from torch import Tensor

from bench.harness.fidelity_forcing import forced_frames
from gpu.model.config import Profile, VoiceChatConfig
from gpu.model.voicechat import VoiceChat
from gpu.model.voicechat_weights import load_dtype, random_weights_on

QUANTITIES = {              # quantity → stage
    "mel.window": "mel",
    "perception.enc": "perception", "perception.audio": "perception",
    "rnnt.logits": "rnnt",
    "thinker.hidden": "thinker", "thinker.text_logits": "thinker", "thinker.func_logits": "thinker",
    "thinker.ssm": "thinker",
    "talker.hidden": "talker", "talker.mog_logits": "talker", "talker.latent": "talker",
    "talker.rvq_scores": "talker",
    "codec.pcm": "codec",
}
ERROR_METRIC = ("rel_max = max|test - ref| / max|ref| over all frames and sessions; "
                "rel_l2 = ||test - ref||_2 / ||ref||_2")
AGREEMENT_RULE = ("top-1 of the tested model's own choice vs the reference's, counted where the "
                  "reference's margin (best - second best score) > tol * max|reference row|; tol by "
                  "the tested stage's precision: fp32 1e-5, TF32 1e-3, bf16 1e-2")
TOL = {"fp32": 1e-5, "tf32": 1e-3, "bf16": 1e-2, "fp8": 6.25e-2}   # fp8: e4m3's 2^-4 step


def reference_profile(profile: Profile) -> Profile:
    """The fp32 profile to compare `profile` with: same talker CFG rows, everything fp32."""
    return Profile.named("fp32" if profile.cfg_rows == 2 else "fp32-dense")


def stage_precision(profile: Profile, stage: str, device: torch.device, chain: bool = False) -> str:
    """'fp8', 'bf16', 'tf32' or 'fp32': the precision the stage computes in under `profile` (docs/MODEL.md §4);
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
    if dtype == torch.float8_e4m3fn:
        return "fp8"
    if dtype != torch.float32:
        return "bf16"
    return "tf32" if profile.tf32 and torch.device(device).type == "cuda" else "fp32"


def build_pair(cfg: VoiceChatConfig, profile: Profile, device: torch.device | str, seed: int = 0,
               kernels: bool = True, against: Profile | None = None) -> tuple[VoiceChat, VoiceChat]:
    """(reference, tested model in `profile`) with the same random weights drawn on `device`
    (on the CPU: `random_weights`); the fp32 tensors are shared, not copied. The reference is
    `reference_profile(profile)` (fp32), or `against`: a serving profile the tested one is an
    option on (dense-ssm16 against dense), which then runs the same kernels, so the two differ
    by the option alone. `kernels` installs the engine's Triton decode ops in the tested model
    (on a CPU set TRITON_INTERPRET=1 before triton is first imported)."""
    # against a serving profile both models hold weights of the same dtypes: drawn in them, one
    # copy serves both (the full model twice in fp32 would not fit one 80 GB card)
    weights = random_weights_on(cfg, device, seed,
                                None if against is None else load_dtype(cfg, against))
    ref = VoiceChat(cfg, against or reference_profile(profile), device)
    ref.load(weights)
    test = VoiceChat(cfg, profile, device)
    test.load(weights)
    del weights
    if kernels:
        from gpu.engine.decode_ops import TritonDecodeOps, install
        install(test, TritonDecodeOps())
        if against is not None:
            install(ref, TritonDecodeOps())
    return ref, test




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

    def result(self, window: int = 1) -> dict:
        return {"rel_max": self.max_err / self.max_ref if self.max_ref else 0.0,
                "rel_l2": (self.sq_err / self.sq_ref) ** 0.5 if self.sq_ref else 0.0,
                "max_abs_err": self.max_err, "max_abs_ref": self.max_ref,
                "rel_max_by_frame": _windows(self.by_frame, window, "max")}


class _KL:
    """KL(reference ‖ tested) of the categorical distributions two sets of logits give, in
    nats, per row; by frame its mean and max over the frame's rows."""

    def __init__(self):
        self.sum = self.rows = 0.0
        self.max = 0.0
        self.mean_by_frame: list[float] = []
        self.max_by_frame: list[float] = []

    def add(self, test: Tensor, ref: Tensor) -> None:
        lp, lq = ref.float().log_softmax(-1), test.float().log_softmax(-1)
        kl = (lp.exp() * (lp - lq)).sum(-1).clamp_min(0.0).flatten()
        total, top = torch.stack([kl.double().sum().float(), kl.max()]).tolist()
        self.sum, self.rows, self.max = self.sum + total, self.rows + kl.numel(), max(self.max, top)
        self.mean_by_frame.append(total / kl.numel())
        self.max_by_frame.append(top)

    def result(self, window: int = 1) -> dict:
        return {"mean": self.sum / self.rows if self.rows else 0.0, "max": self.max,
                "mean_by_frame": _windows(self.mean_by_frame, window, "mean"),
                "max_by_frame": _windows(self.max_by_frame, window, "max")}


def _windows(values: list[float], window: int, how: str) -> list[float]:
    """`values` in windows of `window` frames, each its mean or max (a long call's curve)."""
    if window <= 1:
        return [round(v, 8) for v in values]
    out = []
    for i in range(0, len(values), window):
        part = values[i:i + window]
        out.append(round(max(part) if how == "max" else sum(part) / len(part), 8))
    return out


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


class _Tally:
    """The errors, agreements and KL of a run so far."""

    def __init__(self, profile: Profile, device: torch.device, chain: bool):
        self.err = {name: _Error() for name in QUANTITIES}
        self.tol = {stage: stage_precision(profile, stage, device, chain)
                    for stage in dict.fromkeys(QUANTITIES.values())}
        self.agr = {name: _Agreement(TOL[self.tol[QUANTITIES[name]]], self.tol[QUANTITIES[name]])
                    for name in ("rnnt.logits", "thinker.text_logits", "thinker.func_logits",
                                 "talker.mog_logits", "talker.rvq_scores")}
        self.kl = {name: _KL() for name in ("thinker.text", "thinker.func", "talker.mixture")}

    def add(self, r: dict, d: dict) -> None:
        """One frame's outputs of the reference (r) and the tested model (d)."""
        err, agr, kl = self.err, self.agr, self.kl
        err["thinker.ssm"].add(d["ssm"], r["ssm"])
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
            kl[f"thinker.{choice}"].add(dt[key], rt[key])
            agr[f"thinker.{key}"].add(dt[choice], rt[choice], rt[key], _rowmax(rt[key]))
        if "talker" not in r:                   # a thinker-only run
            return
        rk, dk = r["talker"], d["talker"]
        err["talker.hidden"].add(dk["hidden"], rk["hidden"])
        stack = lambda o, k: torch.stack(o[k])
        err["talker.mog_logits"].add(stack(dk, "mog_logits"), stack(rk, "mog_logits"))
        kl["talker.mixture"].add(stack(dk, "mog_logits"), stack(rk, "mog_logits"))
        agr["talker.mog_logits"].add(stack(dk, "mix_own"), stack(rk, "mixture"),
                                     stack(rk, "mix_scores"), _rowmax(stack(rk, "mog_logits")))
        err["talker.latent"].add(stack(dk, "latent"), stack(rk, "latent"))
        err["talker.rvq_scores"].add(stack(dk, "rvq_scores"), stack(rk, "rvq_scores"))
        scores = stack(rk, "rvq_scores")
        agr["talker.rvq_scores"].add(stack(dk, "code_own"), rk["codes"].T, -scores, _rowmax(scores))
        err["codec.pcm"].add(d["pcm"], r["pcm"])

    def result(self, window: int, thinker_only: bool) -> dict:
        out = {}
        for name, stage in QUANTITIES.items():
            if thinker_only and stage in ("talker", "codec"):
                continue
            out[name] = {"stage": stage, **self.err[name].result(window)}
            if name in self.agr:
                out[name]["top1"] = self.agr[name].result()
        return {"stage_precision": self.tol, "quantities": out,
                "kl": {name: k.result(window) for name, k in self.kl.items()
                       if not (thinker_only and name.startswith("talker"))}}


@torch.no_grad()
def measure(model_ref: VoiceChat, model_test: VoiceChat, sessions: int = 4, frames: int = 16,
            seed: int = 0, chain: bool = False, prompt_len: int = 8, window: int = 1,
            progress=None, thinker_only: bool = False, speech: Tensor | None = None) -> dict:
    """Teacher-forced per-stage errors and top-1 agreement of `model_test` against `model_ref`
    (module docstring) over `frames` frames of `sessions` sessions, and the KL divergence of
    the thinker's and the talker's token distributions (`kl`). Curves over the call are kept in
    windows of `window` frames (max of the errors, mean and max of the KL). After each window
    `progress(frames done, seconds, partial)` is called, `partial()` giving the result so far
    (a long run saves it as it goes). `thinker_only`: the stages up to the thinker (see
    `forced_frames`); the talker's and codec's quantities are left out. `speech`: the users say
    this (fp32 mono, 16 kHz; `fidelity_forcing.inputs`), not noise. JSON-ready."""
    t0 = time.perf_counter()
    dev = model_ref.device
    tally = _Tally(model_test.profile, dev, chain)

    def result(done: int) -> dict:
        return {"config": model_ref.cfg.name, "profile": model_test.profile.name,
                "reference_profile": model_ref.profile.name, "device": str(dev),
                "kernels": model_test.thinker.decode_ops is not None, "sessions": sessions,
                "frames": done, "frames_asked": frames, "seed": seed, "chain": chain,
                "prompt_len": prompt_len, "error_metric": ERROR_METRIC,
                "agreement_rule": AGREEMENT_RULE, "window": window,
                "thinker_only": thinker_only,
                "audio": "noise" if speech is None else f"speech ({len(speech) / 16000:.2f} s)",
                **tally.result(window, thinker_only),
                "seconds": round(time.perf_counter() - t0, 2)}

    for t, fr in enumerate(forced_frames(model_ref, model_test, sessions, frames, seed, chain,
                                         prompt_len, thinker_only, speech)):
        if progress is not None and t and t % window == 0:
            progress(t, time.perf_counter() - t0, lambda: result(t))
        tally.add(fr["ref"], fr["test"])
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return result(frames)


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
