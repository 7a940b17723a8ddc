"""Memory order of the shared frame ring. The bug: its stamps and samples are plain numpy stores
and loads, ordered as x86 orders them; on a host that reorders them (Arm: Grace Hopper) a torn
frame could pass its stamp check. The rings are now shared on store-ordered hosts only (others
send frames and outputs in messages); on this one a writer in another process rewriting the
places in a tight loop must never let a reader accept a torn frame."""
import multiprocessing as mp
import time

import numpy as np
import pytest

from wave_actors.clock.shared_frames import EMPTY, FramesView, SharedFrames
from wave_actors.clock.shared_outputs import SharedOutputs
from wave_actors.clock.shm_segment import unordered_host

SLOTS, RING, GEN = 2, 4, 7


def code(number: int) -> float:
    return float(number % (1 << 20))        # exact in float32


def writer(name: str, seconds: float, started) -> None:
    view = FramesView(name, SLOTS, RING)
    pcm = np.empty(view.pcm.shape[1], np.float32)
    started.set()
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        pcm[:] = code(n)
        view.write(0, GEN, n, pcm)
        n += 1
    view.close()


@pytest.mark.slow
@pytest.mark.skipif(unordered_host() is not None, reason="rings are shared on x86 only")
def test_a_reader_racing_a_writer_in_another_process_never_accepts_a_torn_frame():
    ring = SharedFrames(SLOTS, RING)
    ctx = mp.get_context("spawn")
    started = ctx.Event()
    proc = ctx.Process(target=writer, args=(ring.name, 1.5, started))
    proc.start()
    try:
        assert started.wait(30)
        accepted = torn = 0
        places = np.arange(1, 1 + RING)
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            numbers = ring.number[places].copy()          # the frames the reader expects
            rows = ring.pcm[places].copy()                # samples first, stamps after
            ok = ring.holds(places, np.full(RING, GEN), numbers) & (numbers != EMPTY)
            for i in np.nonzero(ok)[0]:
                accepted += 1
                torn += not (rows[i] == code(int(numbers[i]))).all()
        assert accepted > 1000 and torn == 0
    finally:
        proc.join(10)
        ring.close()


@pytest.mark.parametrize("machine,shared", [("x86_64", True), ("AMD64", True),
                                            ("aarch64", False), ("arm64", False)])
def test_rings_are_shared_only_where_stores_stay_in_order(machine, shared, monkeypatch):
    from wave_actors.clock import shm_segment
    monkeypatch.setattr(shm_segment.platform, "machine", lambda: machine)
    frames, outputs = SharedFrames.create(SLOTS, RING), SharedOutputs.create(SLOTS)
    try:
        assert (frames is not None) == shared and (outputs is not None) == shared
    finally:
        for seg in (frames, outputs):
            if seg is not None:
                seg.close()
