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

import numpy as np
import zmq
import zmq.asyncio

from wave_actors.sessions import worker_wire as W
from wave_actors.clock.clock import Admit, BeatClockActor, BeatRecord, FunctionTokens, Release
from wave_actors.core.contract import ExecutorOptions, Handle
from wave_actors.core.frames import ALL_FRAMES, FIRST_FRAME
from wave_actors.core.registry import make_executor
from wave_actors.core.session_table import Routed
from wave_actors.core.timebase import Clock, new_loop
from wave_actors.runtime.actors import ActorStopped
from wave_actors.clock.shared_outputs import BeatOut
from wave_actors.engine.serving_process import serving_process
from wave_actors.clock.shared_frames import SharedFrames, ring_for
from wave_actors.clock.shared_outputs import SharedOutputs

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


class EngineClock(BeatClockActor):
    """The beat clock with its outputs sent to the session workers, one message a worker a beat,
    and every beat's record sent to the front."""
    reads_wait_out_hold = True
    release_blocks = True

    def __init__(self, executor, ctx, endpoint: str, clock: Clock, policy, start_policy,
                 epoch: int, keep_records: bool, report, shared: SharedOutputs | None = None,
                 frames: SharedFrames | None = None):
        # With `shared`, the executor writes into memory the workers map, and a beat's message
        # to a worker carries its rows' headers only (`_route`). With `frames`, the workers
        # write their frames into memory this clock pulls and packs from, and send nothing.
        self._shared = shared
        self._shared_name = shared.name.encode() if shared is not None else b""
        self._frames = frames
        if frames is not None:
            frames.clear()
        self._told: set[bytes] = set()         # senders told where the frames' ring lies
        super().__init__(executor, ctx, endpoint, clock, self._collect, policy, start_policy,
                         epoch, keep_records=keep_records, frames_ring=frames)
        self.epoch, self.start_policy, self._report = epoch, start_policy, report
        self._stalls_sent = 0.0
        # Each slot's session's worker (an index into `_workers`, -1: not bound yet) and the
        # front's number for it: a beat is routed by these arrays, not per session in Python.
        self._owner_worker = np.full(executor.max_sessions, -1, np.int32)
        self._owner_rid = np.zeros(executor.max_sessions, np.int64)
        self._workers: list[bytes] = []            # socket identities, in order first seen
        self._worker_index: dict[bytes, int] = {}

    def _alloc_outputs(self, executor) -> list:
        if self._shared is None:
            return super()._alloc_outputs(executor)
        self._shared.clear()
        self._fills = [0] * self._shared.depth
        return [executor.alloc_output(out) for out in self._shared.outputs]

    def _refilling(self, index: int) -> None:
        if self._shared is not None:
            self._shared.refilling(index)

    def _filled(self, index: int) -> None:
        if self._shared is not None:
            self._fills[index] = self._shared.filled(index)

    def _tell_ring(self, sender: bytes, force: bool = False) -> None:
        if sender in self._told and not force:
            return
        self._told.add(sender)
        ring = self._frames
        where = (ring.slots, ring.ring, ring.name.encode()) if ring is not None else (0, 0, b"")
        try:
            self._tx.send([sender, *W.frames_at(*where)])
        except zmq.ZMQError:                   # the sender is gone
            pass

    @staticmethod
    def _collect(owner, out: BeatOut) -> bool:
        raise AssertionError("the engine's clock routes by worker (_route)")

    async def handle(self, msg):
        result = await super().handle(msg)
        if isinstance(msg, Admit):
            self._owner_worker[result.slot] = -1   # a new session: unbound until the front says
        return result

    def bind(self, handle: Handle, worker: bytes, rid: int) -> None:
        """Where a current session's outputs go: its worker's socket and the front's number for
        it. Rows of a session not bound yet (or no longer current) are unroutable."""
        entry = self.table.entries.get(handle.slot)
        if entry is None or entry.handle != handle:
            return
        index = self._worker_index.get(worker)
        if index is None:
            index = self._worker_index[worker] = len(self._workers)
            self._workers.append(worker)
        self._owner_worker[handle.slot] = index
        self._owner_rid[handle.slot] = rid

    def _route(self, routed: Routed, out, frames: slice = None) -> None:
        # Once a beat, as arrays: the routed rows ordered by worker, every field gathered once,
        # then each worker's rows sent as contiguous slices of those arrays, in one message.
        # The PCM stays in the shared output buffer, for each worker to copy its own rows out;
        # without one it is gathered here, in one copy (the buffer is refilled two beats on).
        # A first frame routed early travels in the message: the shared buffer is stamped
        # filled only once the whole beat is.
        if not routed:
            return
        frames = frames or ALL_FRAMES
        n = len(routed)
        workers = self._owner_worker[routed.slots]
        order = np.argsort(workers, kind="stable")
        workers = workers[order]
        unbound = int(np.searchsorted(workers, 0))     # -1 sorts first: rows of no worker
        self.stats.unroutable += unbound
        if unbound == n:
            return
        order, workers = order[unbound:], workers[unbound:]
        rows = routed.slots[order]
        head = np.empty(len(rows), W.BEAT_ROW)
        head["rid"] = self._owner_rid[rows]
        head["frame"] = routed.firsts[order] + frames.start
        head["lo"], head["hi"] = frames.start, frames.stop
        for name in ("text", "func", "user"):
            head[name] = getattr(out, name)[rows]
        if self._shared is not None and frames != FIRST_FRAME:
            index = next(i for i, o in enumerate(self._outputs) if o is out)
            where = np.array([(self._shared.slots, self._shared.depth, index,
                               self._fills[index])], W.SHARED_AT)
            slots = rows.astype(np.int32)
            message = lambda a, b: W.beat_at(head[a:b], slots[a:b], where, self._shared_name)
        else:
            pcm = out.pcm[rows, frames]
            message = lambda a, b: W.beat(head[a:b], pcm[a:b])
        cuts = np.flatnonzero(workers[1:] != workers[:-1]) + 1
        starts, ends = np.r_[0, cuts].tolist(), np.r_[cuts, len(rows)].tolist()
        for a, b, index in zip(starts, ends, workers[starts].tolist()):
            try:
                # Slices of fresh arrays nothing writes again: ZMQ takes them uncopied.
                self._tx.send([self._workers[index], *message(a, b)], copy=False)
            except zmq.ZMQError:               # the worker died: its sessions are ending
                self.stats.unroutable += b - a

    def _record(self, rec: BeatRecord) -> None:
        super()._record(rec)
        new = self.stalls.since(self._stalls_sent)
        if new:
            self._stalls_sent = max(s.release for s in new) + 1e-9
        t = self.table.jitter.totals
        self._report(("beat", self.epoch, rec,
                      {"underruns": t.underruns, "dropped": t.dropped,
                       "dropped_frames": self.stats.dropped_frames,
                       "unroutable": self.stats.unroutable, "free_slots": self.free_slots,
                       "outputs_shared": self._shared is not None,
                       "frames_shared": self._frames is not None,
                       "frames_read_by_executor": self._executor_reads,
                       "frames_overwritten": self.table.jitter.overwritten},
                      new))


class EngineServer:
    def __init__(self, executor, conn, share_outputs: bool = True, share_frames: bool = True):
        self.executor, self.conn = executor, conn
        self.ctx = zmq.asyncio.Context()
        self.clock = Clock()
        self.actor: EngineClock | None = None
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
            self.actor.bind(*msg[2:])

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
        self.actor = EngineClock(self.executor, self.ctx, endpoint, self.clock, policy,
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
                                    executor.user_codec, executor.describe(), os.getpid())))
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
