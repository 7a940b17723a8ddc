"""The engine's host work a beat at N sessions, piece by piece, on this CPU (no GPU, no sockets'
I/O threads in the way): frames in, plan, pack, executor hand-over and collect (sim, flat cost),
complete, route to the workers. What the clock's own time a beat is made of as sessions grow.
Frames in: the workers' frames pulled out of the shared ring at the release, or with
`--copy-frames` their messages read as the clock reads them (`--reads` a beat).

    python -m bench.engine_beat_cpu --sessions 300 1000 [--workers 4] [--beats 30]
                                       [--batches 32] [--reads 16] [--copy-route]
                                       [--copy-frames] [--out F]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time

import numpy as np
import zmq

from sim.costmodel import CostModel
from sim.executor import SimExecutor
from wave_actors.bench.provenance import stamp  # noqa: E402
from wave_actors.clock import frame_batch
from wave_actors.sessions import worker_wire as W
from wave_actors.clock.clock import Admit
from wave_actors.core.sched.clock_policy import ClockPolicy
from wave_actors.core.contract import ExecutorOptions, SessionSpec
from wave_actors.core.frames import BEAT_S, FRAMES_PER_BEAT, SAMPLES_IN
from wave_actors.core.sched.start_policy import EagerStarts
from wave_actors.core.timebase import Clock
from wave_actors.engine.to_workers import engine_clock
from wave_actors.sessions.session_worker import frames_wait_s
from wave_actors.clock.shared_frames import SharedFrames, ring_for
from wave_actors.clock.shared_outputs import OutputsView, SharedOutputs

FLAT = "bench/costmodel_flat100.json"


class _Tx:
    """Sends into a real ROUTER whose peers (one DEALER a worker) drain between beats."""

    def __init__(self, workers: int):
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind("inproc://engine-beat-cpu")
        self.peers = []
        for w in range(workers):
            d = self.ctx.socket(zmq.DEALER)
            d.setsockopt(zmq.IDENTITY, b"w%d" % w)
            d.connect("inproc://engine-beat-cpu")
            self.peers.append(d)

    def send(self, frames: list, copy: bool = True) -> None:
        self.router.send_multipart(frames, copy=copy)

    def drain(self, views: list) -> None:
        """Each worker's messages read; with shared outputs, its rows copied out as a worker
        does (`session_worker`), returning that copy's time (the workers', not the clock's)."""
        spent = 0.0
        for d, view in zip(self.peers, views or [None] * len(self.peers)):
            while d.poll(0):
                parts = d.recv_multipart(copy=False)
                if view is not None and bytes(parts[0]) == W.BEAT_AT:
                    t = time.perf_counter()
                    _rows, slots, at, _frames = W.read_beat_at(*(p.buffer for p in parts[1:5]))
                    assert view.take(at["index"], at["fill"], slots) is not None
                    spent += time.perf_counter() - t
        return spent


async def measure(n: int, workers: int, beats: int, batches: int, reads: int,
                  copy_route: bool = False, copy_frames: bool = False) -> dict:
    opts = ExecutorOptions(max_sessions=n, cost_model=FLAT)
    sim = SimExecutor(opts, CostModel.load(FLAT, "reference"), Clock())
    shared = None if copy_route else SharedOutputs(n)
    ring = None if copy_frames else SharedFrames(n, ring_for(ClockPolicy().max_queue))
    clock = engine_clock(sim, None, "inproc://unused", Clock(), ClockPolicy(), EagerStarts(), 0,
                         False, lambda msg: None, shared, ring)
    views = [] if copy_route else [OutputsView(shared.name, n, shared.depth)
                                   for _ in range(workers)]
    tx = _Tx(workers)
    clock._tx = tx
    handles = []
    for i in range(n):
        h = await clock.handle(Admit(("k", i), None, SessionSpec("", [])))
        clock.route.bind(h, b"w%d" % (i % workers), i)
        handles.append(h)
    while not all(clock.slots.book.ready(h.slot) for h in handles):     # every start done
        clock.slots.book.observe(clock.slots.plan(1.0), 0.0)
    pcm = np.random.default_rng(0).standard_normal((2 * n, SAMPLES_IN)).astype(np.float32) * 0.1
    parts = {k: [] for k in ("frames_in", "plan", "pack", "submit_collect", "complete", "route")}
    frame, worker_copy, worker_write = 0, [], []
    for k in range(beats):
        # In arrival order: every session's first frame of the beat, then every second one
        # (a session sends one each 80 ms).
        rows = [(h.slot, h.generation, frame + f) for f in range(FRAMES_PER_BEAT) for h in handles]
        frame += FRAMES_PER_BEAT
        # A worker's batch leaves at most every `frames_wait_s`: a beat's frames arrive in
        # about BEAT_S / frames_wait_s batches a worker.
        sent = []                                  # (when in the beat, message)
        for w in range(workers):
            mine = [i for i in range(len(rows)) if i % n % workers == w]   # its sessions'
            for j, part in enumerate(np.array_split(np.array(mine), min(batches, len(mine)))):
                sent.append((j / batches, [b"w", *frame_batch.encode([rows[i] for i in part],
                                                                    list(pcm[part]))]))
        sent.sort(key=lambda m: m[0])
        # The clock reads every `frames_every_s` all that waits: `reads` reads a beat.
        groups = [[m for when, m in sent if r / reads <= when < (r + 1) / reads]
                  for r in range(reads)]
        inp, out = clock._inputs[k % 2], clock._outputs[k % 2]
        if ring is not None:                       # the workers write, the release pulls
            t = time.perf_counter()
            for (slot, generation, number), row in zip(rows, pcm):
                ring.write(slot, generation, number, row)
            worker_write.append(1e3 * (time.perf_counter() - t))
            t0 = time.perf_counter()
            clock.frames_in.pull_ring()
        else:
            t0 = time.perf_counter()
            for group in groups:
                if group:
                    clock.frames_in.take(group)
        t1 = time.perf_counter()
        plan = clock.slots.plan(0.05)
        t2 = time.perf_counter()
        packed = clock.slots.table.pack(inp, plan.live, gather=not clock._executor_reads)
        t3 = time.perf_counter()
        clock.route.refilling(k % 2)
        sim.submit(plan, inp, out)
        sim._inflight = (0.0, 0.1)
        out.compute_s = sim.collect(plan, out)
        clock.route.filled(k % 2)
        clock.slots.book.observe(plan, out.compute_s)
        t4 = time.perf_counter()
        routed = clock.slots.table.complete(packed, late=False)
        t5 = time.perf_counter()
        clock.route.send(routed, out)
        t6 = time.perf_counter()
        worker_copy.append(1e3 * tx.drain(views))
        for name, a, b in (("frames_in", t0, t1), ("plan", t1, t2), ("pack", t2, t3),
                           ("submit_collect", t3, t4), ("complete", t4, t5), ("route", t5, t6)):
            parts[name].append(1e3 * (b - a))
    skip = min(5, beats // 3)
    ms = {name: round(float(np.median(v[skip:])), 2) for name, v in parts.items()}
    clock_ms = sum(v for name, v in ms.items() if name != "submit_collect")
    for view in views:
        view.close()
    clock._outputs = out = clock.slots = clock.frames_in = None
    for segment in (shared, ring):
        if segment is not None:
            segment.close()
    return {"sessions": n, "workers": workers, "batches_a_worker": batches, "reads": reads,
            "route": "copied into messages" if copy_route else "headers; PCM shared",
            "frames_in": "messages read" if copy_frames else "pulled from the shared ring",
            "ms_p50": ms,
            # The workers' copy of their rows out of the shared outputs, all workers together
            # (their own cores, not the clock's).
            "workers_copy_ms_p50": round(float(np.median(worker_copy[skip:])), 2),
            # The workers' writes of their frames into the ring, all workers together.
            "workers_write_ms_p50": round(float(np.median(worker_write[skip:])), 2)
            if worker_write else None,
            "clock_ms_p50": round(clock_ms, 2),
            "clock_us_per_session": round(1e3 * clock_ms / n, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[300, 1000])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--beats", type=int, default=30)
    ap.add_argument("--batches", type=int, default=round(BEAT_S / frames_wait_s(ClockPolicy())),
                    help="frame batches a worker a beat")
    ap.add_argument("--reads", type=int, default=round(BEAT_S / ClockPolicy().frames_every_s),
                    help="the clock's frame reads a beat (0: every batch read alone)")
    ap.add_argument("--copy-route", action="store_true",
                    help="PCM copied into each worker's message (no shared outputs)")
    ap.add_argument("--copy-frames", action="store_true",
                    help="frames' samples in the workers' messages (no shared ring)")
    ap.add_argument("--out")
    args = ap.parse_args()
    results = []
    for n in args.sessions:
        r = asyncio.run(measure(n, args.workers, args.beats, args.batches,
                                args.reads or args.workers * args.batches, args.copy_route,
                                args.copy_frames))
        results.append(r)
        print(f"{n:5d} sessions: clock {r['clock_ms_p50']:6.2f} ms a beat "
              f"({r['clock_us_per_session']} us a session); {r['ms_p50']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "python -m bench.engine_beat_cpu " + " ".join(
                f"--sessions {' '.join(map(str, args.sessions))} --workers {args.workers} "
                f"--beats {args.beats} --batches {args.batches} --reads {args.reads}"
                f"{' --copy-route' if args.copy_route else ''}"
                f"{' --copy-frames' if args.copy_frames else ''}".split()),
                **stamp(),
                "machine": f"{platform.machine()}, {os.cpu_count()} cores (no GPU: sim executor)",
                "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
