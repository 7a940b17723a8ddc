"""Hand the caller its node's endpoint, or relay its traffic through the fleet's entry point?
This measures what the relay would cost. A real sim node serves N sessions that stream audio in
real time from a few bridge connections, first straight to the node, then through a relay
process: a ZeroMQ ROUTER for the bridges with one DEALER to the node per bridge connection
(so the node still binds sessions to connections, and heartbeats and resumes keep working).
Reported for each way: ping round trips on a connection of their own (what the relay adds to
every message), the audio frames each caller heard (the relay must lose none), and the relay
process's CPU, per message and per second. A frame is lost in when the node neither heard
it nor counted it dropped, and lost out when the node sent it and the caller never read it.

    python bench/fleet_relay.py --sessions 64 --seconds 20 --out bench/results/fleet-relay.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transports.client import NodeClient                         # noqa: E402
from transports.client_events import Audio                       # noqa: E402
from wave_actors.bench.provenance import stamp                   # noqa: E402

FRAME_S = 0.08
FRAME = np.zeros(1280, dtype=np.float32).tobytes()          # 80 ms of 16 kHz pcm_f32le
CONNECTIONS = 4                                             # bridges sharing the sessions


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def relay(front: str, back: str, counts, ready) -> None:
    """The relay process: every message from a bridge connection goes out on that connection's
    own DEALER to the node, and every message back the other way, until SIGTERM."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.RCVHWM, 100_000)
    router.setsockopt(zmq.SNDHWM, 100_000)
    router.bind(front)
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    ready.set()
    dealers: dict[bytes, zmq.Socket] = {}
    owner: dict[zmq.Socket, bytes] = {}
    while True:
        for sock, _ in poller.poll(100):
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                counts[0] += 1
                if sock is router:
                    ident = frames[0].bytes
                    dealer = dealers.get(ident)
                    if dealer is None:
                        dealer = ctx.socket(zmq.DEALER)
                        dealer.setsockopt(zmq.IDENTITY, ident)
                        dealer.setsockopt(zmq.RCVHWM, 100_000)
                        dealer.setsockopt(zmq.SNDHWM, 100_000)
                        dealer.connect(back)
                        dealers[ident], owner[dealer] = dealer, ident
                        poller.register(dealer, zmq.POLLIN)
                    dealer.send_multipart(frames[1:], copy=False)
                else:
                    router.send_multipart([owner[sock], *frames], copy=False)


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def counted(session, heard: list[int], k: int) -> None:
    """Count the session's audio as it arrives: its `close` skips what is still queued."""
    deliver = session.deliver

    def deliver_counted(event) -> None:
        heard[k] += isinstance(event, Audio)
        deliver(event)
    session.deliver = deliver_counted


async def stream(session, until: float) -> None:
    loop = asyncio.get_running_loop()
    t = loop.time()
    while t < until:
        await session.send_audio(FRAME)
        while not session.events.empty():
            session.events.get_nowait()
        t += FRAME_S
        await asyncio.sleep(max(0.0, t - loop.time()))


async def one_way(endpoint: str, sessions: int, seconds: float, probe) -> dict:
    """N sessions streaming for `seconds` through `endpoint`; `probe()` (wall time, CPU seconds,
    messages relayed) is read as the streams start and end, so opens and closes stay out."""
    clients = [NodeClient(endpoint) for _ in range(CONNECTIONS)]
    prober = NodeClient(endpoint)
    for c in [*clients, prober]:
        c.connect()
    heard = [0] * sessions
    opened = []
    for k in range(sessions):
        opened.append(await clients[k % CONNECTIONS].open(f"s{k}"))
        counted(opened[-1], heard, k)
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    first = probe()
    streams = [asyncio.create_task(stream(s, until)) for s in opened]
    rtts = []
    while loop.time() < until:
        t = time.perf_counter()
        await prober.ping(nonce=len(rtts))
        rtts.append(1e3 * (time.perf_counter() - t))
        await asyncio.sleep(0.02)
    await asyncio.gather(*streams)
    last = probe()
    closed = [await s.close() for s in opened]
    for c in [*clients, prober]:
        await c.aclose()
    stats = [c.stats for c in closed]
    wall = last[0] - first[0]
    out = {"pings": len(rtts), "ping_p50_ms": round(float(np.percentile(rtts, 50)), 3),
           "ping_p99_ms": round(float(np.percentile(rtts, 99)), 3),
           "frames_sent": sum(s.seq for s in opened),
           "frames_in": sum(x.get("frames_in", 0) for x in stats),
           "dropped_in": sum(x.get("dropped_in", 0) for x in stats),
           "frames_out": sum(x.get("frames_out", 0) for x in stats),
           "audio_heard": sum(heard),
           "lost_out": sum(x.get("frames_out", 0) for x in stats) - sum(heard),
           "lost_in": sum(s.seq for s in opened) - sum(x.get("frames_in", 0) + x.get(
               "dropped_in", 0) for x in stats), "dropped_events": sum(s.dropped_events for s in opened),
           "node_cpu_per_s": round((last[1] - first[1]) / wall, 3)}
    if len(first) > 2:
        msgs = last[3] - first[3]
        out.update(messages=int(msgs), relay_cpu_per_s=round((last[2] - first[2]) / wall, 3),
                   relay_us_per_message=round(1e6 * (last[2] - first[2]) / max(msgs, 1), 2),
                   messages_per_session_s=round(msgs / wall / sessions, 1))
    return out


def start_node(port: int, sessions: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "wave_actors.node", "--backend", "sim", "--workers", "0",
         "--max-sessions", str(sessions), "--bind", f"tcp://127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    for line in proc.stdout:
        if line.startswith("{") and '"listening"' in line:
            break
    else:
        raise RuntimeError(f"the node exited ({proc.wait()}) before listening")
    return proc


def measure(sessions: int, seconds: float) -> dict:
    port = free_port()
    node = start_node(port, sessions)
    try:
        back = f"tcp://127.0.0.1:{port}"
        direct = asyncio.run(one_way(back, sessions, seconds,
                                     lambda: (time.perf_counter(), cpu_s(node.pid))))
        front = f"tcp://127.0.0.1:{free_port()}"
        spawn = mp.get_context("spawn")         # no ZeroMQ context of ours in the relay
        counts = spawn.Array("d", 1, lock=False)
        ready = spawn.Event()
        proc = spawn.Process(target=relay, args=(front, back, counts, ready), daemon=True)
        proc.start()
        try:
            if not ready.wait(60):
                raise RuntimeError("the relay did not start")
            relayed = asyncio.run(one_way(front, sessions, seconds, lambda: (
                time.perf_counter(), cpu_s(node.pid), cpu_s(proc.pid), counts[0])))
        finally:
            proc.terminate()
            proc.join(5)
    finally:
        node.terminate()
        node.wait(10)
    per_node = relayed["relay_us_per_message"] * relayed["messages_per_session_s"] * 300 / 1e6
    return {"sessions": sessions, "seconds": seconds, "direct": direct, "relay": relayed,
            "added_p50_ms": round(relayed["ping_p50_ms"] - direct["ping_p50_ms"], 3),
            "added_p99_ms": round(relayed["ping_p99_ms"] - direct["ping_p99_ms"], 3),
            "relay_cores_per_300_session_node": round(per_node, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[64])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out")
    a = ap.parse_args()
    if min(a.sessions) < 1 or a.seconds <= 0:
        ap.error("--sessions and --seconds must be > 0")
    rows = []
    for n in a.sessions:
        print(f"{n} sessions, {a.seconds:g} s each way ...", flush=True)
        rows.append(measure(n, a.seconds))
        r = rows[-1]
        print(f"  ping p50/p99 direct {r['direct']['ping_p50_ms']}/{r['direct']['ping_p99_ms']} "
              f"ms, relay {r['relay']['ping_p50_ms']}/{r['relay']['ping_p99_ms']} ms; relay "
              f"{r['relay']['relay_us_per_message']} µs a message, "
              f"{r['relay_cores_per_300_session_node']} cores per 300-session node; frames lost "
              f"in/out {r['direct']['lost_in']}/{r['direct']['lost_out']} direct, "
              f"{r['relay']['lost_in']}/{r['relay']['lost_out']} relayed", flush=True)
    out = {"command": "python " + " ".join([sys.argv[0], *sys.argv[1:]]), **stamp(),
           "cpus": os.cpu_count(), "rows": rows}
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    else:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
