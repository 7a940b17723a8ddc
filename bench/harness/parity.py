"""Parity of an executor against the reference model run eagerly on the same device.

`engine_run` drives an executor through `BeatDriver` exactly as the clock does (open, start
beats, then live beats on given audio); `reference_run` replays the same sessions through the plain
PyTorch model (no kernels, no graphs): the same weights, prompts, noise keys and audio. Both
return per-frame tokens and PCM, and `compare` says how far apart they are.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
import torch

from bench.harness.beat_driver import BeatDriver
from gpu.engine.decode_ops import install
from wave_actors.core.contract import SessionSpec
from wave_actors.core.prompt import prompt_tokens
from wave_actors.core.frames import FRAMES_PER_BEAT


@dataclass
class Run:
    text: np.ndarray     # [N, T]
    func: np.ndarray     # [N, T]
    user: np.ndarray     # [N, T, 10]
    pcm: np.ndarray      # [N, T, 1764]


def engine_run(executor, specs: list[SessionSpec], audio: np.ndarray,
               slots: list[int]) -> tuple[Run, list[int]]:
    """audio float32 [N, T, 1280] for sessions opened in `slots`; T even. Each session hears
    audio[i, t] at its own frame t, whenever its start let it go live (sessions with shorter
    prompts start sooner), so its run is comparable frame by frame with the reference's.
    Returns the run and each session's noise key (its session number)."""
    n, frames = audio.shape[:2]
    driver = BeatDriver(executor)
    keys = [driver.open(slot, spec) for slot, spec in zip(slots, specs)]
    row_of = {slot: i for i, slot in enumerate(slots)}
    got = Run(*(np.zeros((n, frames) + tail, dtype) for tail, dtype in
                (((), np.int64), ((), np.int64), ((10,), np.int64), ((1764,), np.float32))))
    done = np.zeros(n, np.int64)                    # frames recorded per session

    def heard(plan) -> np.ndarray:
        full = np.zeros((executor.max_sessions, FRAMES_PER_BEAT, audio.shape[-1]), np.float32)
        for slot, t in zip(plan.live, plan.frame0):
            if slot in row_of and t < frames:
                full[slot] = audio[row_of[slot], t:t + FRAMES_PER_BEAT]
        return full

    async def drive() -> None:
        for _ in range(1000 + frames):
            if done.min() >= frames:
                return
            plan, out = await driver.beat(heard)
            for slot, t0 in zip(plan.live, plan.frame0):
                i = row_of.get(slot)
                for f in range(FRAMES_PER_BEAT):
                    if i is None or t0 + f >= frames:
                        continue
                    t = t0 + f
                    got.text[i, t], got.func[i, t] = out.text[slot, f], out.func[slot, f]
                    got.user[i, t], got.pcm[i, t] = out.user[slot, f], out.pcm[slot, f]
                    done[i] = max(done[i], t + 1)
        raise AssertionError("sessions never ran their frames")

    asyncio.run(drive())
    return got, keys


@torch.no_grad()
def reference_run(model, codec, specs: list[SessionSpec], audio: np.ndarray, keys: list[int],
                  seed: int) -> Run:
    """The same sessions through the plain model (decode hooks off), one prompt chunk each."""
    ops = model.thinker.decode_ops
    install(model, None)
    try:
        dev = model.device
        n, frames = audio.shape[:2]
        prompts = [prompt_tokens(codec, s.instructions, s.tools) for s in specs]
        longest = max(len(p) for p in prompts)
        state = model.alloc_state(n, frames + 2, longest)
        slots = torch.arange(n, device=dev)
        state.reset(slots)
        tokens = torch.zeros(n, longest, dtype=torch.long, device=dev)
        for i, p in enumerate(prompts):
            tokens[i, :len(p)] = torch.tensor(p, device=dev)
        model.prefill_chunk(state, slots, tokens, torch.tensor([len(p) for p in prompts], device=dev))
        model.warmup_chunk(state, slots, model.cfg.talker.n_warmup)
        session = torch.tensor(keys, device=dev)
        run = Run(np.zeros((n, frames), np.int64), np.zeros((n, frames), np.int64),
                  np.zeros((n, frames, 10), np.int64), np.zeros((n, frames, 1764), np.float32))
        for t in range(frames):
            o = model.step(state, torch.from_numpy(audio[:, t]).to(dev), slots,
                           model.noise(seed, session, torch.full((n,), t, device=dev)),
                           torch.full((n,), -1, device=dev))
            run.text[:, t], run.func[:, t] = o.text.cpu().numpy(), o.func.cpu().numpy()
            run.user[:, t], run.pcm[:, t] = o.user.cpu().numpy(), o.pcm.cpu().numpy()
        return run
    finally:
        install(model, ops)


def compare(a: Run, b: Run) -> dict:
    """Agreement of token streams (fraction of frames equal, and frames until the first
    difference) and the PCM deviation."""
    def first_diff(x, y):
        diff = np.flatnonzero((x != y).reshape(x.shape[0], x.shape[1], -1).any(-1).any(0))
        return int(diff[0]) if len(diff) else int(x.shape[1])
    scale = float(np.abs(b.pcm).max()) or 1.0
    return {"text_equal": float((a.text == b.text).mean()), "func_equal": float((a.func == b.func).mean()),
            "user_equal": float((a.user == b.user).all(-1).mean()),
            "frames_identical": first_diff(np.stack([a.text, a.func], -1), np.stack([b.text, b.func], -1)),
            "pcm_max_abs": float(np.abs(a.pcm - b.pcm).max()), "pcm_rel": float(np.abs(a.pcm - b.pcm).max() / scale)}
