"""The engine process: the executor and the beat clock, alone on their loop.

With session workers (`NodeConfig.workers` > 0) the node runs in three kinds of process: the
front (client socket, admission, bindings, the workers' supervisor), N session workers, and this
one. Here the loop does only the clock's work: read the workers' frame batches, release, pack,
submit, collect, and send each worker its rows of the beat's outputs in one message. No client
message and no session actor's work competes with the release.

The front drives it over a pipe (`engine_host.EngineHost`): pickled tuples, a few a session's
lifetime (admit, bind, tokens, release) and one a beat back (the beat's record and counters).
Each clock incarnation is numbered (its epoch): a message naming an older one is ignored, so a
restarted clock never acts on its predecessor's requests.

    front → engine   ("call", req, name, args)          an executor method, no clock running
                     ("clock_start", epoch, endpoint, policy, start_policy, keep_records)
                     ("clock_stop", epoch)
                     ("admit", epoch, req, key, spec)  → ("reply", req, ok, handle | exception)
                     ("bind", epoch, handle, worker, rid)   where the session's outputs go
                     ("release", epoch, req, handle, stream_ended)   → ("reply", ...)
                     ("tokens", epoch, handle, ids)
                     ("exit",)
    engine → front   ("hello", facts) | ("failed", why)   once, after the executor is built
                     ("started", epoch) | ("stopped", epoch, start_policy) | ("crashed", epoch, why)
                     ("ready", epoch, handle, started)   an admitted session's start is planned in
                     ("beat", epoch, record, totals, stalls)
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import pickle
import select
import traceback
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from wave_actors.clock.clock import Admit, BeatClockActor, FunctionTokens, Release
from wave_actors.clock.shared_frames import SharedFrames, ring_for
from wave_actors.clock.shared_outputs import SharedOutputs
from wave_actors.core.contract import ExecutorOptions, Handle
from wave_actors.core.registry import make_executor
from wave_actors.core.timebase import Clock, new_loop
from wave_actors.engine.serving_process import serving_process
from wave_actors.engine.to_workers import engine_clock
from wave_actors.runtime.actors import ActorStopped

log = logging.getLogger("wave.engine")
PARENT_CHECK_S = 0.5


@dataclass(frozen=True)
class ExecutorSpec:
    """What the engine process builds: an executor by registry name and its options."""
    backend: str
    options: ExecutorOptions
    # The beat's outputs in shared memory the workers read (else copied into each message).
    share_outputs: bool = True
    # The frames' samples in shared memory the workers write (else sent in their messages).
    share_frames: bool = True

    def build(self):
        return make_executor(self.backend, self.options)


@dataclass
class EngineFacts:
    """What the front needs of the executor without holding it."""
    max_sessions: int
    text_codec: Any
    user_codec: Any
    described: dict
    pid: int
    snapshot_space: Any = None      # the executor's prompt snapshots (None: it keeps none)


class EngineServer:
    def __init__(self, executor, conn, share_outputs: bool = True, share_frames: bool = True):
        self.executor, self.conn = executor, conn
        self.ctx = zmq.asyncio.Context()
        self.clock = Clock()
        self.actor: BeatClockActor | None = None
        self.epoch = -1
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self.reports_lost = 0
        # The output buffers every clock of this process fills, mapped by the workers (None:
        # not made yet, or no shared memory here: the clocks then copy rows into messages).
        self.shared: SharedOutputs | None = None
        self._shared_tried = not share_outputs
        # The frames' ring, made at the first clock start (its size follows the clock's jitter
        # buffer bound) and again for a clock whose bound differs.
        self.frames: SharedFrames | None = None
        self._share_frames = share_frames
        self._writable = select.poll()
        self._writable.register(conn.fileno(), select.POLLOUT)

    def send(self, msg: tuple) -> None:
        try:
            self.conn.send(msg)
        except (BrokenPipeError, OSError):
            self._stop.set()                  # the front is gone

    def report(self, msg: tuple) -> None:
        """A beat's report ("beat", epoch, record, totals, stalls), sent only when the pipe
        takes it at once: a front that stops reading must not stop the clock, so a report that
        would wait is dropped and counted (the next one carries the count: `reports_lost`)."""
        msg[3]["reports_lost"] = self.reports_lost
        blob = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        if len(blob) + 4 > select.PIPE_BUF or not self._writable.poll(0):
            self.reports_lost += 1
            return
        try:
            self.conn.send_bytes(blob)
        except (BrokenPipeError, OSError):
            self._stop.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self.conn.fileno(), self._readable)
        watch = loop.create_task(self._watch_parent())
        await self._stop.wait()
        loop.remove_reader(self.conn.fileno())
        watch.cancel()
        await self._stop_clock()
        self.ctx.destroy(linger=0)

    async def _watch_parent(self) -> None:
        parent = os.getppid()
        while os.getppid() == parent:
            await asyncio.sleep(PARENT_CHECK_S)
        self._stop.set()

    def _readable(self) -> None:
        try:
            while self.conn.poll():
                self._on(self.conn.recv())
        except (EOFError, OSError):
            self._stop.set()

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on(self, msg: tuple) -> None:
        op = msg[0]
        if op == "exit":
            self._stop.set()
        elif op == "call":
            _, req, name, args = msg
            try:
                attr = getattr(self.executor, name, None)       # None: it has none
                self.send(("reply", req, True, attr(*args) if callable(attr) else attr))
            except Exception as exc:
                self.send(("reply", req, False, RuntimeError(f"{name}: {exc!r}")))
        elif op == "clock_start":
            self._spawn(self._start_clock(*msg[1:]))
        elif op == "clock_stop":
            if msg[1] == self.epoch:
                self._spawn(self._stop_clock())
        elif msg[1] != self.epoch or self.actor is None or self.actor.stopped.is_set():
            if op in ("admit", "release"):
                self.send(("reply", msg[2], False, ActorStopped("the clock is not running")))
        elif op == "admit":
            self._spawn(self._admit(*msg[2:]))
        elif op == "release":
            self._spawn(self._release(*msg[2:]))
        elif op == "tokens":
            self.actor.tell(FunctionTokens(msg[2], msg[3]))
        elif op == "bind":
            self.actor.route.bind(*msg[2:])

    async def _start_clock(self, epoch, endpoint, policy, start_policy, keep_records) -> None:
        await self._stop_clock()
        self.epoch = epoch
        if not self._shared_tried:
            self._shared_tried = True
            self.shared = SharedOutputs.create(self.executor.max_sessions)
        ring = ring_for(policy.max_queue)
        if self._share_frames and (self.frames is None or self.frames.ring != ring):
            if self.frames is not None:
                self.frames.close()
            self.frames = SharedFrames.create(self.executor.max_sessions, ring)
            self._share_frames = self.frames is not None    # none to be had here: not again
        self.actor = engine_clock(self.executor, self.ctx, endpoint, self.clock, policy,
                                  start_policy, epoch, keep_records, self.report, self.shared,
                                  self.frames)
        task = self.actor.start()
        task.add_done_callback(lambda t, e=epoch: self._clock_ended(t, e))
        self.send(("started", epoch))

    def _clock_ended(self, task: asyncio.Task, epoch: int) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.send(("crashed", epoch, "".join(traceback.format_exception_only(exc)).strip()))

    async def _stop_clock(self) -> None:
        actor, self.actor = self.actor, None
        if actor is None:
            return
        await actor.stop()
        self.send(("stopped", actor.epoch, actor.start_policy))

    async def _admit(self, req, key, spec) -> None:
        actor = self.actor
        try:
            handle = await actor.ask(Admit(key, None, spec))
        except Exception as exc:
            self.send(("reply", req, False, exc))
            return
        self.send(("reply", req, True, handle))
        started = await actor.when_ready(handle)
        self.send(("ready", actor.epoch, handle, bool(started)))

    async def _release(self, req, handle: Handle, stream_ended: bool) -> None:
        try:
            stats = await self.actor.ask(Release(handle, stream_ended))
        except Exception as exc:
            self.send(("reply", req, False, exc))
            return
        self.send(("reply", req, True, stats))


def engine_main(spec: ExecutorSpec, conn) -> None:
    """The engine process's entry point (spawned by `EngineHost`)."""
    logging.basicConfig(level=logging.WARNING)
    try:
        executor = spec.build()
    except Exception as exc:
        conn.send(("failed", "".join(traceback.format_exception_only(exc)).strip()))
        return
    conn.send(("hello", EngineFacts(executor.max_sessions, executor.text_codec,
                                    executor.user_codec, executor.describe(), os.getpid(),
                                    getattr(executor, "snapshot_space", None))))
    loop = new_loop()
    asyncio.set_event_loop(loop)
    server = None
    try:
        with serving_process():
            server = EngineServer(executor, conn, spec.share_outputs, spec.share_frames)
            loop.run_until_complete(server.run())
    finally:
        loop.close()
        try:
            executor.close()
        except Exception:
            log.exception("engine: closing the executor failed")
        if server is not None:
            server.actor = None            # its arrays are views of the segments
            for segment in (server.shared, server.frames):
                if segment is not None:
                    segment.close()
        gc.collect()
