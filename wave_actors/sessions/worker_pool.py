"""The front's side of the session workers: start them, shard sessions across them, carry each
session's messages, and notice a worker's death.

`RemoteSession` is what the node holds for a session that runs in a worker: it takes the same
messages a SessionActor does (`tell` of audio, close, function results) and asks
the worker for what the node's close needs (`finish`, `drops`). What a
session sends its client comes back batched and is routed by the node (`on_sends`); the front
counts the audio its clients took or could not take, so `closed.stats` stays exact even for a
session whose worker died.

A worker that dies takes only its sessions: the pool reports them (`on_lost`), fails every
answer they wait for, and starts a new worker in its place (at most `max_restarts` in
`window_s`, then the pool stays one worker short and says so in the log).
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import multiprocessing as mp
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import zmq
import zmq.asyncio

from transports import zsock
from wave_actors.sessions import worker_wire as W
from wave_actors.runtime.actors import ActorStopped, MsgClass
from wave_actors.sessions.messages import AudioIn, Close, FunctionResult, SessionConfig
from wave_actors.sessions.session_worker import FRAMES_WAIT_S, worker_main
from wave_actors.core.tasks import within

log = logging.getLogger("wave.workers")
READY_TIMEOUT_S = 60.0          # a spawned worker imports numpy, zmq and soxr before it is ready
ASK_TIMEOUT_S = 5.0
AUDIO_WAIT_S = 0.002            # how long clients' audio waits to share a message to its worker


@dataclass
class PoolHandlers:
    on_sends: Callable[[int, bool, list], None]       # rid, is audio, frames for its client
    on_closing: Callable[[int, str], None]            # rid, reason: the session asks to close
    on_crashed: Callable[[int, str], None]            # rid, exception name
    on_tokens: Callable[[int, list[int]], None]       # rid, function-result tokens
    on_lost: Callable[[list[int]], None]              # rids of a worker that died
    on_stale: Callable[[int], None] = lambda n: None  # beat rows a worker read too late


@dataclass
class _Worker:
    index: int
    proc: Any
    ready: asyncio.Future
    identity: bytes | None = None
    rids: set[int] = field(default_factory=set)
    audio: list = field(default_factory=list)         # (rid, seq, payload) read this turn
    dead: bool = False                                # its process's sentinel fired

    @property
    def clock_identity(self) -> bytes:
        """Its frames socket's identity on the beat clock's ROUTER, where its outputs go."""
        return W.clock_identity(self.index, self.proc.pid)

    @property
    def alive(self) -> bool:
        # Not `proc.exitcode`: that polls the process (a system call) on every message.
        return self.identity is not None and not self.dead


class RemoteSession:
    """A session running in a worker, as the node sees it."""

    def __init__(self, pool: "WorkerPool", worker: _Worker, rid: int, cfg: SessionConfig):
        self.pool, self.worker, self.rid, self.cfg = pool, worker, rid, cfg
        self.closing = False
        self.frames_sent = 0          # audio messages its client took
        self.dropped_out = 0          # audio messages its client could not take

    def tell(self, msg: Any, cls: MsgClass = MsgClass.CONTROL) -> None:
        if not self.worker.alive or self.rid not in self.worker.rids:
            raise ActorStopped(f"session {self.cfg.session!r} has no worker")
        if isinstance(msg, AudioIn):
            self.pool.queue_audio(self.worker, self.rid, msg)
        elif isinstance(msg, Close):
            self.pool.send(self.worker, W.ctrl("close", self.rid, msg.reason))
        elif isinstance(msg, FunctionResult):
            self.pool.send(self.worker, W.ctrl("func", self.rid, msg.call_id, msg.output))
        else:
            raise TypeError(f"unexpected message {type(msg).__name__}")

    def count_flooded(self, payload: bytes, seq: int | None = None) -> None:
        if self.worker.alive:
            self.pool.send(self.worker, W.ctrl("flooded", self.rid, len(payload), seq))

    def sent(self, ok: bool) -> None:
        if ok:
            self.frames_sent += 1
        else:
            self.dropped_out += 1

    async def finish(self) -> bool:
        """Audio queued before the close is taken, waiting outputs are sent, and the frames'
        end is marked to the clock: whether the marker went out."""
        return (await self.pool.ask(self.worker, self.rid, "finish"))[0]

    async def drops(self) -> int:
        """Input frames lost on the worker's side of the clock; the session stops there."""
        return (await self.pool.ask(self.worker, self.rid, "flush"))[0]

    # What a resume announces, from the front's own counts: every audio message the session
    # sends passes the front, so the next one's seq is the count of those; and the front's
    # next input seq (`Route.next_seq`) is never behind the session's.
    expected_seq = 0

    @property
    def out_seq(self) -> int:
        return self.frames_sent + self.dropped_out


class WorkerPool:
    REPLY = {"finish": "ended", "flush": "drops"}

    def __init__(self, n: int, ctx: zmq.asyncio.Context, codecs: tuple, handlers: PoolHandlers,
                 max_restarts: int = 5, window_s: float = 10.0,
                 frames_wait_s: float = FRAMES_WAIT_S):
        if n < 1:
            raise ValueError("a pool has at least one worker")
        self.n, self.ctx, self.codecs, self.h = n, ctx, codecs, handlers
        self.max_restarts, self.window_s = max_restarts, window_s
        self.frames_wait_s = frames_wait_s     # how long a worker's frames wait to share a message
        self.workers: dict[int, _Worker] = {}
        self._by_identity: dict[bytes, _Worker] = {}      # the live workers, by socket identity
        self.sessions: dict[int, RemoteSession] = {}
        self.restarts = 0
        self.unknown = 0              # messages from a replaced worker or for a finished session
        self._restart_times: collections.deque = collections.deque()
        self._rids = itertools.count(1)
        self._asks: dict[tuple[int, str], asyncio.Future] = {}
        self._flush_due = False
        self.lost_to_dead = 0         # audio messages queued for a worker that then died
        self.stale_rows = 0           # beat rows the engine refilled before a worker read them
        self._stopping = False
        self._task: asyncio.Task | None = None
        self.dir = ""

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="wave-node-")        # mode 0700: this user's only
        self.endpoint = f"ipc://{self.dir}/workers"
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.bind(self.endpoint)
        self.tx = zsock.Tx(self.sock)
        self._task = asyncio.get_running_loop().create_task(self._recv())
        for i in range(self.n):
            self._spawn(i)
        await within(asyncio.gather(*(w.ready for w in self.workers.values())),
                               READY_TIMEOUT_S)

    def _spawn(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        proc = mp.get_context("spawn").Process(
            target=worker_main, args=(index, self.endpoint, self.codecs, self.frames_wait_s),
            daemon=True,
            name=f"wave-worker-{index}")
        proc.start()
        worker = self.workers[index] = _Worker(index, proc, loop.create_future())
        loop.add_reader(proc.sentinel, self._died, worker)

    async def stop(self) -> None:
        self._stopping = True
        for w in self.workers.values():
            if w.alive:
                try:
                    self.send(w, W.ctrl("stop"))
                except zmq.ZMQError:
                    pass
        loop = asyncio.get_running_loop()
        for w in self.workers.values():
            loop.remove_reader(w.proc.sentinel)
            await loop.run_in_executor(None, w.proc.join, 2.0)
            if w.proc.exitcode is None:
                w.proc.terminate()
                await loop.run_in_executor(None, w.proc.join, 2.0)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.tx.close(0)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _died(self, worker: _Worker) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(worker.proc.sentinel)
        worker.dead = True
        worker.proc.join(0)
        if not worker.ready.done():
            worker.ready.set_exception(RuntimeError(
                f"session worker {worker.index} exited with code {worker.proc.exitcode} "
                "before it was ready"))
        self._by_identity.pop(worker.identity, None)
        worker.identity = None
        lost = sorted(worker.rids)
        worker.rids.clear()
        for key in [k for k in self._asks if k[0] in lost]:
            fut = self._asks.pop(key)
            if not fut.done():
                fut.set_exception(ActorStopped("its worker died"))
        for rid in lost:
            self.sessions.pop(rid, None)
        if self._stopping:
            return
        log.error("session worker %d (pid %s) exited with code %s; its %d sessions end",
                  worker.index, worker.proc.pid, worker.proc.exitcode, len(lost))
        if lost:
            self.h.on_lost(lost)
        now = time.monotonic()
        while self._restart_times and now - self._restart_times[0] > self.window_s:
            self._restart_times.popleft()
        if len(self._restart_times) >= self.max_restarts:
            log.error("session worker %d restarted %d times in %.0f s: left stopped",
                      worker.index, len(self._restart_times), self.window_s)
            return
        self._restart_times.append(now)
        self.restarts += 1
        self._spawn(worker.index)

    # -- sessions ---------------------------------------------------------------------------------
    def open(self, cfg: SessionConfig) -> RemoteSession:
        """A session on the live worker with the fewest; ActorStopped when none is live."""
        live = [w for w in self.workers.values() if w.alive]
        if not live:
            raise ActorStopped("no session worker is running")
        worker = min(live, key=lambda w: (len(w.rids), w.index))
        rid = next(self._rids)
        worker.rids.add(rid)
        session = self.sessions[rid] = RemoteSession(self, worker, rid, cfg)
        self.send(worker, W.ctrl("start", rid, cfg, cfg.clock_endpoint))
        return session

    def forget(self, rid: int) -> None:
        session = self.sessions.pop(rid, None)
        if session is not None:
            session.worker.rids.discard(rid)

    def send(self, worker: _Worker, parts: list) -> None:
        """A message to a worker after the audio and outputs queued for it (in order)."""
        if worker.audio:
            self._flush(worker)
        self.tx.send([worker.identity, *parts])

    # A send on an ipc socket costs tens of µs of the loop (ZMQ wakes its I/O thread), and
    # clients' audio arrives a message at a time, spread over the beat: it goes to each worker
    # as one message every AUDIO_WAIT_S instead (a frame waits at most that long; the worker's
    # frames wait longer on their way to the clock, and the jitter buffer holds three).
    def queue_audio(self, worker: _Worker, rid: int, msg: AudioIn) -> None:
        worker.audio.append((rid, msg.seq, msg.payload))
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_later(AUDIO_WAIT_S, self._flush_all)

    def _flush_all(self) -> None:
        self._flush_due = False
        for w in self.workers.values():
            if w.audio:
                self._flush(w)

    def _flush(self, w: _Worker) -> None:
        audio, w.audio = w.audio, []
        if not w.alive:
            self.lost_to_dead += len(audio)
            return
        try:
            self.tx.send([w.identity, *W.audio(audio)])
        except zmq.ZMQError as exc:     # the worker went away between the check and the send
            self.lost_to_dead += len(audio)
            log.warning("messages to session worker %d lost: %r", w.index, exc)

    async def ask(self, worker: _Worker, rid: int, op: str) -> tuple:
        if not worker.alive or rid not in worker.rids:
            raise ActorStopped("its worker is gone")
        key = (rid, self.REPLY[op])
        fut = self._asks[key] = asyncio.get_running_loop().create_future()
        self.send(worker, W.ctrl(op, rid))
        try:
            return await within(fut, ASK_TIMEOUT_S)
        finally:
            self._asks.pop(key, None)

    # -- from the workers -------------------------------------------------------------------------
    async def _recv(self) -> None:
        await zsock.serve(self.tx, self._on, log,
                          "front: a message from a session worker")

    def _on(self, parts: list) -> None:
        identity, kind = parts[0], parts[1]
        if kind == W.CTRL:
            msg = W.read_ctrl(parts[2])
            if msg[0] == "ready":
                worker = self.workers.get(msg[1])
                if worker is not None and not worker.ready.done() and worker.proc.pid == msg[2]:
                    worker.identity = identity
                    self._by_identity[identity] = worker
                    worker.ready.set_result(None)
                return
        worker = self._by_identity.get(identity)
        if worker is None:
            self.unknown += 1             # from a worker already replaced
            return
        if kind == W.SENDS:
            for rid, audio_msg, frames in W.read_sends(parts[2:]):
                if rid in worker.rids:
                    self.h.on_sends(rid, audio_msg, frames)
                else:
                    self.unknown += 1
            return
        if kind != W.CTRL:
            self.unknown += 1
            return
        if msg[0] == "stale":            # rows refilled before the worker copied them
            self.stale_rows += msg[1]
            self.h.on_stale(msg[1])
            return
        op, rid, *args = msg
        if rid not in worker.rids:
            self.unknown += 1
            return
        if op in ("ended", "drops"):
            fut = self._asks.get((rid, op))
            if fut is not None and not fut.done():
                fut.set_result(tuple(args))
        elif op == "gone":
            fut = self._asks.get((rid, self.REPLY[args[0]]))
            if fut is not None and not fut.done():
                fut.set_exception(ActorStopped("the worker no longer has the session"))
        elif op == "closing":
            self.h.on_closing(rid, args[0])
        elif op == "crashed":
            self.h.on_crashed(rid, args[0])
        elif op == "tokens":
            self.h.on_tokens(rid, args[0])
