"""The engine process's own CPU a beat at N sessions, on real sockets and the real loop: the
engine process (sim executor, flat 100 ms beat) with its clock started as the node starts it,
N sessions admitted and bound, and W stand-in workers in one other process that send every
session's frames in batches as real workers do (one message a worker each `frames_wait_s`; the
frames written into the engine's shared ring instead once the clock says where it lies) and
read, or copy out of the shared outputs, each beat's rows. No front, no session actors, no
clients: what is left is what the engine's clock costs, timers, sockets and all.

    python -m bench.engine_loop --sessions 300 1000 [--workers 8] [--beats 100]
                                [--frames-every-ms 10] [--frames-wait-ms W] [--copy-route]
                                [--copy-frames]
                                [--out F]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import tempfile
import time

import numpy as np
import zmq

from wave_actors.bench.provenance import stamp  # noqa: E402
from wave_actors.clock import frame_batch
from wave_actors.sessions import worker_wire as W
from wave_actors.clock.clock import Admit
from wave_actors.core.sched.clock_policy import ClockPolicy
from wave_actors.core.contract import ExecutorOptions, SessionSpec
from wave_actors.core.frames import BEAT_S, SAMPLES_IN
from wave_actors.core.sched.start_policy import EagerStarts
from wave_actors.engine.host import ClockProxy, EngineHost
from wave_actors.engine.process import ExecutorSpec
from wave_actors.sessions.session_worker import frames_wait_s
from wave_actors.clock.shared_frames import FramesView
from wave_actors.clock.shared_outputs import OutputsView

FLAT = "bench/costmodel_flat100.json"
FRAME_S = BEAT_S / 2


def stand_in_workers(endpoint: str, handles: list[list[tuple[int, int]]], wait_s: float,
                     seconds: float, ready) -> None:
    """Worker w sends its sessions' frames: each session one frame every 80 ms (sessions spread
    over the 80 ms), gathered for `wait_s` into one message; beat messages are read, and shared
    rows copied out, as a worker does."""
    ctx = zmq.Context()
    socks = []
    for w in range(len(handles)):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, W.clock_identity(w, os.getpid()))
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        socks.append(s)
    ready.send([W.clock_identity(w, os.getpid()) for w in range(len(handles))])
    pcm = (np.random.default_rng(0).standard_normal(SAMPLES_IN) * 0.1).astype(np.float32)
    views: dict[str, OutputsView] = {}
    rings: list[FramesView | None] = [None] * len(handles)
    t0 = time.monotonic()
    sent = [[0] * len(h) for h in handles]      # frames sent, per session
    next_send = t0
    while (now := time.monotonic()) < t0 + seconds:
        if now >= next_send:
            for w, hs in enumerate(handles):
                rows = []
                for i, (slot, gen) in enumerate(hs):
                    due = int((now - t0 - (i / max(1, len(hs))) * FRAME_S) / FRAME_S) + 1
                    while sent[w][i] < due:
                        rows.append((slot, gen, sent[w][i]))
                        sent[w][i] += 1
                if rows and rings[w] is not None:     # the clock finds them there
                    for slot, gen, number in rows:
                        rings[w].write(slot, gen, number, pcm)
                elif rows:
                    socks[w].send_multipart(frame_batch.encode(rows, [pcm] * len(rows)))
            next_send += wait_s
        for w, s in enumerate(socks):
            while s.poll(0):
                parts = s.recv_multipart()
                if parts[0] == W.FRAMES_AT:
                    slots, ring, name = W.read_frames_at(*parts[1:3])
                    rings[w] = FramesView(name, slots, ring) if name else None
                elif parts[0] == W.BEAT_AT:
                    _rows, slots, at, _frames = W.read_beat_at(*parts[1:5])
                    view = views.get(at["name"])
                    if view is None:
                        view = views[at["name"]] = OutputsView(at["name"], at["slots"],
                                                               at["depth"])
                    view.take(at["index"], at["fill"], slots)
        time.sleep(max(0.0, min(next_send - time.monotonic(), 0.002)))
    ctx.destroy(linger=0)


async def measure(host: EngineHost, n: int, workers: int, beats: int, policy: ClockPolicy,
                  wait_s: float) -> dict:
    ipc = tempfile.mkdtemp(prefix="wave-el-")
    endpoint = f"ipc://{ipc}/clock"
    proxy = ClockProxy(host, 1, endpoint, policy, EagerStarts(), True, None)
    proxy.start()
    handles = [await proxy.ask(Admit(("k", i), None, SessionSpec("", []))) for i in range(n)]
    per_worker = [[(h.slot, h.generation) for h in handles[w::workers]] for w in range(workers)]
    warm = 20
    seconds = (beats + warm + 10) * BEAT_S
    here, there = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(
        target=stand_in_workers,
        args=(endpoint, per_worker, wait_s, seconds, there), daemon=True)
    proc.start()
    identities = await asyncio.get_running_loop().run_in_executor(None, here.recv)
    for i, h in enumerate(handles):
        proxy.bind(h, identities[i % workers], i)
    await asyncio.sleep(seconds)
    proc.join(10)
    records = [r for r in proxy.stats.records[warm:warm + beats]]
    await proxy.stop()
    loop_ms = np.array([1e3 * r.loop_cpu_s for r in records])
    proc_ms = np.array([1e3 * r.process_cpu_s for r in records])
    own_ms = np.array([1e3 * (r.process_cpu_s - r.executor_cpu_s) for r in records])
    return {"sessions": n, "workers": workers, "beats": len(records),
            "frames_every_ms": 1e3 * policy.frames_every_s, "frames_wait_ms": 1e3 * wait_s,
            "outputs_shared": proxy.outputs_shared, "frames_shared": proxy.frames_shared,
            "frames_overwritten": proxy.frames_overwritten,
            "late": sum(r.late for r in records),
            "loop_cpu_ms": {"p50": round(float(np.median(loop_ms)), 2),
                            "p99": round(float(np.percentile(loop_ms, 99)), 2)},
            "process_cpu_ms": {"p50": round(float(np.median(proc_ms)), 2),
                               "p99": round(float(np.percentile(proc_ms, 99)), 2)},
            # The process less the sim executor's hearing (the device's work in a GPU node).
            "clock_process_cpu_ms": {"p50": round(float(np.median(own_ms)), 2),
                                     "p99": round(float(np.percentile(own_ms, 99)), 2)},
            "frames_read_by_executor": proxy.frames_read_by_executor,
            "frames_read_p50": float(np.median([r.frames_read for r in records])),
            "dropped_frames": proxy.stats.dropped_frames,
            "underruns": proxy.jitter_totals.underruns}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[300, 1000])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--beats", type=int, default=100)
    ap.add_argument("--frames-every-ms", type=float, default=1e3 * ClockPolicy().frames_every_s)
    ap.add_argument("--frames-wait-ms", type=float,
                    help="how long a stand-in worker's frames wait to share a message "
                         "(default: as a worker does, `frames_wait_s` of the clock policy)")
    ap.add_argument("--copy-route", action="store_true",
                    help="PCM copied into each worker's message (no shared outputs)")
    ap.add_argument("--copy-frames", action="store_true",
                    help="frames' samples in the workers' messages (no shared ring)")
    ap.add_argument("--out")
    args = ap.parse_args()
    policy = ClockPolicy(frames_every_s=args.frames_every_ms / 1e3)
    wait = frames_wait_s(policy) if args.frames_wait_ms is None else args.frames_wait_ms / 1e3
    results = []
    for n in args.sessions:
        host = EngineHost(ExecutorSpec("sim", ExecutorOptions(max_sessions=n, cost_model=FLAT),
                                       share_outputs=not args.copy_route,
                                       share_frames=not args.copy_frames)).start()
        try:
            r = asyncio.run(measure(host, n, args.workers, args.beats, policy, wait))
        finally:
            host.close()
        results.append(r)
        print(f"{n:5d} sessions, {args.workers} workers: engine loop {r['loop_cpu_ms']['p50']} "
              f"ms a beat (p99 {r['loop_cpu_ms']['p99']}), process {r['process_cpu_ms']['p50']} "
              f"(p99 {r['process_cpu_ms']['p99']}), less the executor's hearing "
              f"{r['clock_process_cpu_ms']['p50']} (p99 {r['clock_process_cpu_ms']['p99']}); late {r['late']}, outputs shared {r['outputs_shared']}, frames shared "
              f"{r['frames_shared']} (dropped {r['dropped_frames']}, underruns {r['underruns']})",
              flush=True)
    if args.out:
        command = (f"python -m bench.engine_loop --sessions {' '.join(map(str, args.sessions))}"
                   f" --workers {args.workers} --beats {args.beats} --frames-every-ms "
                   f"{args.frames_every_ms:g}")
        if args.frames_wait_ms is not None:
            command += f" --frames-wait-ms {args.frames_wait_ms:g}"
        if args.copy_route:
            command += " --copy-route"
        if args.copy_frames:
            command += " --copy-frames"
        with open(args.out, "w") as f:
            json.dump({"command": command,
                       **stamp(),
                       "machine": f"{platform.machine()}, {os.cpu_count()} cores (sim executor)",
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
