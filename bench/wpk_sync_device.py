"""The wpk synchronisation probes on the GPU (issue 18, stage 0): each checked, then timed.

- chain: one program an SM, each waiting for the next (the reverse of launch order), launched
  cooperatively: the result must be the suffix sum; time a hop = the kernel's time / programs.
- rounds: grid barriers on one never-reset counter, two a round: every round's sums must be
  right; time a barrier = the kernel's time / barriers.
- doorbell: one program answers a doorbell in pinned host memory with a release store; the host
  rings with a plain store into a numpy view and spins on the answer: the round trip a beat,
  and the GPU clock's stamps (must rise beat by beat).
- mailbox: `gpu.wpk.mailbox`'s controller with stand-in lanes in one cooperative grid: each
  beat rung, its frames and end awaited by the host; the lanes' outputs must be right.

    python bench/wpk_sync_device.py [--out bench/results/wpk-sync-h200.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cuda_timing import median_ms  # noqa: E402
from bench.harness import wpk_probes as probes  # noqa: E402


def chain(n: int) -> dict:
    values = torch.arange(1, n + 1, dtype=torch.int32, device="cuda")
    out = torch.zeros(n, dtype=torch.int32, device="cuda")
    counters = torch.zeros(n, dtype=torch.int32, device="cuda")

    def run():
        counters.zero_()
        probes.chain[(n,)](values, counters, out, n, IS_INTERP=False,
                           launch_cooperative_grid=True)
    ms = median_ms(run, 5)
    want = torch.flip(torch.cumsum(torch.flip(values, (0,)), 0), (0,))
    return {"programs": n, "correct": bool(torch.equal(out, want)), "kernel_ms": round(ms, 4),
            "us_per_hop": round(1e3 * ms / n, 3)}


def rounds(n: int, n_rounds: int) -> dict:
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    slots = torch.zeros(n, dtype=torch.int32, device="cuda")
    out = torch.zeros(n_rounds * n, dtype=torch.int32, device="cuda")
    block = 1 << (n - 1).bit_length()

    def run():
        counter.zero_()
        probes.rounds[(n,)](counter, slots, out, n, n_rounds, BLOCK=block, IS_INTERP=False,
                            launch_cooperative_grid=True)
    ms = median_ms(run, 5)
    want = torch.tensor([sum(r * 1000 + p for p in range(n)) for r in range(n_rounds)],
                        dtype=torch.int32, device="cuda")
    ok = bool(torch.equal(out.view(n_rounds, n), want[:, None].expand(n_rounds, n)))
    return {"programs": n, "rounds": n_rounds, "correct": ok, "kernel_ms": round(ms, 4),
            "us_per_barrier": round(1e3 * ms / (2 * n_rounds), 3)}


def doorbell(beats: int) -> dict:
    bell = torch.zeros(1, dtype=torch.int64, pin_memory=True)
    ack = torch.zeros(1, dtype=torch.int64, pin_memory=True)
    stamps = torch.zeros(beats, dtype=torch.int64, device="cuda")
    # Warm: compile and load before the resident run (a first load while resident hangs).
    bell.fill_(1)
    probes.doorbell[(1,)](bell, ack, stamps[:1], 1, IS_INTERP=False)
    torch.cuda.synchronize()
    bell.zero_()
    ack.zero_()
    b, a = bell.numpy(), ack.numpy()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        probes.doorbell[(1,)](bell, ack, stamps, beats, IS_INTERP=False)
    rtt, lost = [], 0
    for e in range(1, beats + 1):
        t = time.perf_counter()
        b[0] = e
        deadline = t + 2.0
        while a[0] < e:
            if time.perf_counter() > deadline:
                lost += 1
                break
        rtt.append(1e6 * (time.perf_counter() - t))
    stream.synchronize()
    gaps = np.diff(stamps.cpu().numpy())
    return {"beats": beats, "answered": beats - lost, "rtt_us_p50": round(float(np.median(rtt)), 2),
            "rtt_us_p99": round(float(np.percentile(rtt, 99)), 2),
            "stamps_rise": bool((gaps > 0).all())}


def mailbox(beats: int, lanes: int = 4) -> dict:
    """The mailbox's controller and `lanes` stand-in lanes, one cooperative grid: the host
    rings each beat and waits for its frames and its end, then drains, relaunches, exits."""
    from gpu.wpk import mailbox as M
    box = M.Mailbox("cuda")
    work = torch.zeros(1, dtype=torch.int32, device="cuda")
    args = torch.zeros(1, dtype=torch.int32, device="cuda")
    frames = torch.zeros(2, dtype=torch.int32, device="cuda")
    out = torch.full((beats + 1, 2, lanes), -1, dtype=torch.int32, device="cuda")
    grid = (1 + lanes,)

    def launch(first_seq, runs):
        M.controller_and_lanes[grid](box.block, work, args, frames, out, lanes, beats + 1,
                                     first_seq, runs, 10**9, IS_INTERP=False,
                                     launch_cooperative_grid=True)
    # Warm-up (loads the module before anything is resident): one beat, then EXIT.
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        launch(1, 0)
    box.wait_beat(box.run(beat=1, live=1), timeout_s=10)
    box.ring(M.EXIT)
    stream.synchronize()
    box = M.Mailbox("cuda")
    work.zero_()
    frames.zero_()
    out.fill_(-1)
    with torch.cuda.stream(stream):
        launch(1, 0)
    ring_to_ack, ring_to_frame0, ring_to_done, device_us = [], [], [], []
    words, ack = box.words, M.ACK.value
    for i in range(beats):
        t = time.perf_counter()
        ring = box.run(beat=i + 1, live=i % 7 + 1, timeout_s=2)
        deadline = t + 2.0
        while words[ack] < ring.seq and time.perf_counter() < deadline:
            pass                                 # a tight spin: when the controller read it
        ring_to_ack.append(1e6 * (time.perf_counter() - t))
        box.wait_frame(ring, 0, timeout_s=2)
        t0 = time.perf_counter()
        box.wait_beat(ring, timeout_s=2)
        t1 = time.perf_counter()
        ring_to_frame0.append(1e6 * (t0 - t))
        ring_to_done.append(1e6 * (t1 - t))
        st = box.stamps(ring)
        device_us.append((st[3] - st[0]) / 1e3)
    box.ring(M.EXIT)
    box.wait_state(M.EXIT, timeout_s=5)
    stream.synchronize()
    got = out[:beats].cpu()
    want = torch.tensor([[[(i % 7 + 1) * 100 + f * 10 + lane for lane in range(lanes)]
                          for f in range(2)] for i in range(beats)], dtype=torch.int32)
    return {"beats": beats, "lanes": lanes, "correct": bool(torch.equal(got, want)),
            "error": box.error(),
            "ring_to_ack_us_p50": round(float(np.median(ring_to_ack)), 2),
            "ring_to_frame0_us_p50": round(float(np.median(ring_to_frame0)), 2),
            "ring_to_beat_done_us_p50": round(float(np.median(ring_to_done)), 2),
            "ring_to_beat_done_us_p99": round(float(np.percentile(ring_to_done, 99)), 2),
            "device_doorbell_to_done_us_p50": round(float(np.median(device_us)), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    result = {"gpu": torch.cuda.get_device_name(0), "sms": sms,
              "chain": chain(sms), "rounds": rounds(sms, 500), "doorbell": doorbell(500),
              "mailbox": mailbox(500)}
    for key in ("chain", "rounds", "doorbell", "mailbox"):
        print(f"{key:9s} {result[key]}", flush=True)
    if args.out:
        from wave_actors.bench.provenance import stamp
        result.update(command="python bench/wpk_sync_device.py --out " + args.out,
                      **stamp(),
                      host=platform.node(), torch=torch.__version__)
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
