"""The baseline users have today: the reference model serving one session at a time, eager.

Same weights and precision profile as the engine under test, plain PyTorch (no kernels, no
graphs), batch 1, its caches filled to the benchmark's context. A GPU serving sessions one after
another fits floor(160 ms / beat) of them on time; that is the figure the engine is compared to.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from gpu.engine.decode_ops import TritonDecodeOps, install
from wave_actors.core.frames import BEAT_MS, FRAMES_PER_BEAT, SAMPLES_IN


def measure_baseline(model, context: int, beats: int = 8, seed: int = 0) -> dict:
    """Eager beats of one session at `context` frames; restores the model's fast path after."""
    ops = model.thinker.decode_ops
    install(model, None)
    try:
        return _measure(model, context, beats, seed)
    finally:
        install(model, ops if ops is not None else TritonDecodeOps())


def _measure(model, context: int, beats: int, seed: int) -> dict:
    dev = model.device
    state = model.alloc_state(1, context + FRAMES_PER_BEAT * (beats + 2), 8)
    slot = torch.zeros(1, dtype=torch.long, device=dev)
    state.reset(slot)
    model.warmup_chunk(state, slot, model.cfg.talker.n_warmup)
    for t in (state.thinker.k, state.thinker.v, state.talker.k, state.talker.v):
        t.normal_()
    state.thinker.length[slot] += context
    state.talker.position[slot] += context
    gen = torch.Generator(device=dev).manual_seed(seed)
    times = []
    for beat in range(beats + 1):                   # the first beat warms up and is not counted
        audio = 0.1 * torch.randn(FRAMES_PER_BEAT, 1, SAMPLES_IN, device=dev, generator=gen)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for f in range(FRAMES_PER_BEAT):
            frame = torch.full((1,), beat * FRAMES_PER_BEAT + f, device=dev)
            model.step(state, audio[f], slot, model.noise(seed, slot, frame),
                       torch.full((1,), -1, device=dev))
        torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    beat_ms = 1000 * float(np.median(times[1:]))
    return {"beat_ms_p50": beat_ms, "beat_ms_max": 1000 * max(times[1:]), "beats": beats,
            "context": context, "sessions_on_time": int(BEAT_MS // beat_ms)}
