"""Helpers of the Realtime bridge's end-to-end tests: the node and the bridge as subprocesses on
free ports (every wait bounded), audio to send, and reading a socket's events until one comes."""
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from transports.audio import encode

ROOT = Path(__file__).resolve().parents[2]
KEY = "test-key-123"
FRAME_S = 0.08


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], ready: str, log: Path, env: dict | None = None) -> subprocess.Popen:
    """Start `python args...`, wait (bounded) until its output contains `ready`."""
    f = open(log, "w")
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if ready in log.read_text():
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{args[:2]} did not start:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def start_node(tmp: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = start(["-m", "wave_actors.node", "--bind", endpoint, "--backend", "sim",
                  "--max-sessions", "8", *extra], "listening", tmp / f"node{len(extra)}.log")
    return proc, endpoint


def tone(spec_fmt: str, rate: int, seconds: float) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    return encode((0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), spec_fmt)


async def recv_json(ws, timeout: float = 5.0) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def until(ws, type_: str, timeout: float = 5.0, seen: list | None = None) -> dict:
    """Events until one of `type_` (the skipped ones go to `seen`)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        ev = await recv_json(ws, max(0.01, deadline - asyncio.get_running_loop().time()))
        if ev["type"] == type_:
            return ev
        if seen is not None:
            seen.append(ev)


async def http_get(port: int, path: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    """One GET; the bridge closes the connection after a non-WebSocket answer."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}",
             *(f"{k}: {v}" for k, v in (headers or {}).items()), "", ""]
    writer.write("\r\n".join(lines).encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    hdrs = {}
    for line in header_lines:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return int(status_line.split()[1]), hdrs, body
