"""`python bench/wpk_soak.py --beats 10000 --out bench/results/wpk-soak-h200.json`: the wpk
executor driven for many beats with random host delays, on a GPU (tiny model, frames from a real
shared ring): sessions close and open (slot resets), contexts roll, a bucket is captured now and
then between beats (the controller drained and relaunched), and the host sleeps at random before
a beat, while its frames are written, and between beats. Every beat must end within `--limit-s`
(a hang is reported, not waited out) and the controller must never be given up. Prints and
writes what happened: beats, doorbell beats, fail-overs, maintenance pauses, the beat's wall
time p50 / p99 / max.
"""
from __future__ import annotations

import argparse
import dataclasses
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.beat_driver import BeatDriver                       # noqa: E402
from wave_actors.core.contract import ExecutorOptions, SessionSpec        # noqa: E402
from wave_actors.core.frames import FRAMES_PER_BEAT, SAMPLES_IN           # noqa: E402
from wave_actors.core.sched.jitter import SILENCE                              # noqa: E402
from wave_actors.core.sched.jitter_arrays import FramesToRead, RingPlaces       # noqa: E402
from wave_actors.core.sched.spread import spread_ms                             # noqa: E402
from wave_actors.clock.shared_frames import SharedFrames                        # noqa: E402

SLOTS, RING = 8, 8


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--beats", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit-s", type=float, default=5.0, help="a beat longer than this hung")
    ap.add_argument("--max-delay-ms", type=float, default=3.0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--executor", choices=("wpk", "cpu"), default="wpk",
                    help="cpu: a dry run of the driver on the reference model (no GPU)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    opts = ExecutorOptions(max_sessions=SLOTS, profile="reference", config="tiny", max_context=64)
    if args.executor == "wpk":
        from gpu.engine.wpk_executor import WpkExecutor
        w = WpkExecutor(opts)
    else:
        from gpu.engine.cpu_executor import CpuExecutor
        w = CpuExecutor(dataclasses.replace(opts, profile="fp32"))
    wpk_facts = lambda: w.describe().get("wpk", {"failed": None})      # noqa: E731
    ring = SharedFrames.create(SLOTS, RING)
    driver = BeatDriver(w)
    gens = np.zeros(SLOTS, np.int64)
    frame_of = np.zeros(SLOTS, np.int64)
    open_slots: set[int] = set()
    counts = {"opens": 0, "closes": 0, "rolls": 0, "resets": 0, "captures": 0, "hangs": 0,
              "torn": 0, "nonfinite_rows": 0}
    walls: list[float] = []
    delay = lambda: rng.uniform(0, args.max_delay_ms) / 1e3      # noqa: E731

    def open_one(slot: int) -> None:
        gens[slot] += 1
        frame_of[slot] = 0
        driver.open(slot, SessionSpec(instructions=f"soak {slot} {gens[slot]}"))
        open_slots.add(slot)
        counts["opens"] += 1

    def heard(plan):
        if rng.random() < 0.2:
            time.sleep(delay())                  # the host late while it writes the frames
        audio = np.zeros((SLOTS, FRAMES_PER_BEAT, SAMPLES_IN), np.float32)
        places = np.zeros((SLOTS, FRAMES_PER_BEAT), np.int64)
        nums = np.full((SLOTS, FRAMES_PER_BEAT), SILENCE, np.int64)
        for slot in plan.live:
            for f in range(FRAMES_PER_BEAT):
                num = int(frame_of[slot])
                frame_of[slot] += 1
                pcm = (0.1 * np.sin(np.arange(SAMPLES_IN) * (0.01 + 0.001 * slot) + num)
                       ).astype(np.float32)
                ring.write(slot, int(gens[slot]), num, pcm)
                places[slot, f] = ring.places(np.array([slot]), np.array([num]))[0]
                nums[slot, f] = num
        driver.inp.frames = FramesToRead(RingPlaces(ring, gens), places, gens.copy(), nums)
        return audio

    async def soak() -> None:
        for slot in range(SLOTS - 2):
            open_one(slot)
        t_last = time.perf_counter()
        for k in range(args.beats):
            if k % 97 == 0 and open_slots and rng.random() < 0.7:     # a call ends, one begins
                gone = rng.choice(sorted(open_slots))
                driver.close(gone)
                open_slots.discard(gone)
                counts["closes"] += 1
                free = [s for s in range(SLOTS) if s not in open_slots and s != gone]
                open_one(rng.choice(free))
            if k % 1500 == 750 and hasattr(w, "prepare"):              # maintenance
                w.prepare(rng.choice([1, 2, 4, SLOTS]))
                counts["captures"] += 1
            if rng.random() < 0.3:
                await asyncio.sleep(delay())                            # the loop busy elsewhere
            t0 = time.perf_counter()
            try:
                plan, out = await asyncio.wait_for(driver.beat(heard), args.limit_s)
            except asyncio.TimeoutError:
                counts["hangs"] += 1
                print(f"beat {k}: no end within {args.limit_s} s", flush=True)
                raise
            walls.append(time.perf_counter() - t0)
            counts["rolls"] += len(plan.roll)
            counts["resets"] += len(plan.resets)
            if driver.inp.frames is not None:
                counts["torn"] += sum(len(s) for s, _ in driver.inp.frames.torn)
            live = np.asarray(plan.live, np.int64)
            if len(live):
                counts["nonfinite_rows"] += int((~np.isfinite(out.pcm[live]).all(axis=(1, 2))).sum())
            if time.perf_counter() - t_last > 10:
                t_last = time.perf_counter()
                print(f"  beat {k + 1}/{args.beats}: {wpk_facts()}", flush=True)

    ok = True
    try:
        asyncio.run(soak())
    except asyncio.TimeoutError:
        ok = False
    facts = wpk_facts()
    w.close()
    ring.close()
    result = {
        "command": "python bench/wpk_soak.py " + " ".join(sys.argv[1:]),
        "commit": _commit(), "beats_run": len(walls), "beats_asked": args.beats,
        "ok": ok and facts["failed"] is None and counts["nonfinite_rows"] == 0
        and len(walls) == args.beats,
        "wall_ms": spread_ms(walls), "counts": counts, "wpk": facts}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["ok"] else 1


def _commit() -> str:
    from wave_actors.bench.provenance import provenance
    return provenance()["commit"]


if __name__ == "__main__":
    raise SystemExit(main())
