"""The front's side of the engine process (`engine_process.py`): start it, call the executor's
setup methods, and stand in for the beat clock.

`EngineHost` owns the process and offers what the front and the bench read of an executor
(`max_sessions`, the codecs, `describe`, `prepare`, `baseline`, `close`), so a benchmark builds
one model for all its runs as it does in one process. `ClockProxy` is the supervised "clock"
actor of a node with session workers: it asks the engine's clock to admit and release, forwards
tool tokens and output bindings, and mirrors its beat records, counters and stalls. When the
engine's clock crashes or its process dies the proxy crashes, so the node's supervisor ends the
sessions and starts a new incarnation (a new process when the old one died) as it does for a
clock in its own loop.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import multiprocessing as mp
import time
from types import SimpleNamespace
from typing import Any, Callable

from wave_actors.clock.beat_stats import BeatRecord, ClockStats
from wave_actors.clock.clock import Admit, FunctionTokens, Release
from wave_actors.core.contract import Handle
from wave_actors.core.tasks import within
from wave_actors.engine.process import EngineFacts, ExecutorSpec, engine_main
from wave_actors.runtime.actors import Actor, ActorStopped, MsgClass

log = logging.getLogger("wave.engine")
ASK_TIMEOUT_S = 5.0
START_TIMEOUT_S = 30.0         # a clock incarnation's start (its executor's reset)
STOP_TIMEOUT_S = 10.0
PROGRESS_S = 10.0              # a long model build says it is still going this often


class EngineFailed(RuntimeError):
    pass


class EngineHost:
    def __init__(self, spec: ExecutorSpec, build_timeout_s: float = 1800.0):
        self.spec, self.build_timeout_s = spec, build_timeout_s
        self.proc = None
        self.conn = None
        self.facts: EngineFacts | None = None
        self._reqs = itertools.count(1)
        self._replies: dict[int, asyncio.Future] = {}
        self._proxy: ClockProxy | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.restarts = 0

    # -- the process ------------------------------------------------------------------------------
    def start(self) -> "EngineHost":
        """Spawn the process and wait for its executor (a GPU model's build and captures can take
        minutes: progress is logged). EngineFailed with the reason when it does not come up."""
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=engine_main, args=(self.spec, child), daemon=True,
                           name="wave-engine")
        proc.start()
        child.close()
        began = time.monotonic()
        while not parent.poll(PROGRESS_S):
            waited = time.monotonic() - began
            if not proc.is_alive():
                raise EngineFailed(f"the engine process exited with code {proc.exitcode} "
                                   "while building its executor")
            if waited > self.build_timeout_s:
                proc.kill()
                raise EngineFailed(f"the engine's executor was not built in {waited:.0f} s")
            log.warning("engine: building the %s executor (%.0f s)", self.spec.backend, waited)
        try:
            msg = parent.recv()
        except EOFError:
            proc.join(5)
            raise EngineFailed(f"the engine process exited with code {proc.exitcode}") from None
        if msg[0] != "hello":
            proc.join(5)
            raise EngineFailed(f"the engine's executor failed to build: {msg[1]}")
        self.proc, self.conn, self.facts = proc, parent, msg[1]
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.exitcode is None

    def close(self) -> None:
        proc, conn = self.proc, self.conn
        if proc is None:
            return
        if self._loop is not None:
            self.detach()
        try:
            conn.send(("exit",))
        except (BrokenPipeError, OSError):
            pass
        proc.join(30)
        if proc.exitcode is None:
            proc.kill()
            proc.join(5)
        conn.close()
        self.proc = self.conn = None

    # -- an executor's surface --------------------------------------------------------------------
    @property
    def max_sessions(self) -> int:
        return self.facts.max_sessions

    @property
    def text_codec(self):
        return self.facts.text_codec

    @property
    def user_codec(self):
        return self.facts.user_codec

    @property
    def snapshot_space(self):
        """The executor's prompt snapshots, as built (None: it keeps none)."""
        return self.facts.snapshot_space

    def describe(self) -> dict:
        """The executor's facts: asked afresh while no node drives the engine, else as built."""
        if self._loop is None and self.alive:
            self.facts.described = self.call("describe")
        return self.facts.described

    def prepare(self, n: int) -> None:
        self.call("prepare", n)

    def baseline(self, context: int) -> dict:
        return self.call("baseline", context)

    def call(self, name: str, *args) -> Any:
        """One of the executor's methods, or an attribute's value (None when it has neither),
        while no node drives it."""
        if self._loop is not None:
            raise RuntimeError("the engine is driven by a node: no direct calls")
        req = next(self._reqs)
        self.conn.send(("call", req, name, args))
        while True:
            if not self.conn.poll(PROGRESS_S):
                if not self.alive:
                    raise EngineFailed(f"the engine process exited with code "
                                       f"{self.proc.exitcode} during {name}")
                continue
            msg = self.conn.recv()
            if msg[0] == "reply" and msg[1] == req:
                if not msg[2]:
                    raise msg[3]
                return msg[3]

    # -- driven by a node's loop ------------------------------------------------------------------
    def attach(self, proxy: "ClockProxy") -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:
                self.detach()
            self._loop = loop
            loop.add_reader(self.conn.fileno(), self._readable)
            loop.add_reader(self.proc.sentinel, self._died)
        self._proxy = proxy

    def detach(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            for fd in (self.conn.fileno(), self.proc.sentinel):
                self._loop.remove_reader(fd)
        self._loop, self._proxy = None, None
        self._fail_replies(ActorStopped("the engine was detached"))

    async def restart(self) -> None:
        """A new process in place of one that died (its executor built afresh)."""
        if self.proc is not None:
            self.proc.join(0)
            self.conn.close()
            self.proc = self.conn = None
        self.restarts += 1
        await asyncio.get_running_loop().run_in_executor(None, self.start)

    def send(self, msg: tuple) -> None:
        if not self.alive:
            raise ActorStopped("the engine process is not running")
        try:
            self.conn.send(msg)
        except (BrokenPipeError, OSError) as exc:
            raise ActorStopped(f"the engine process is gone: {exc}") from None

    async def request(self, op: str, epoch: int, *args, timeout: float = ASK_TIMEOUT_S) -> Any:
        req = next(self._reqs)
        fut = self._replies[req] = asyncio.get_running_loop().create_future()
        try:
            self.send((op, epoch, req, *args))
            return await within(fut, timeout)
        finally:
            self._replies.pop(req, None)

    def _fail_replies(self, exc: BaseException) -> None:
        replies, self._replies = self._replies, {}
        for fut in replies.values():
            if not fut.done():
                fut.set_exception(exc)

    def _readable(self) -> None:
        try:
            while self.conn is not None and self.conn.poll():
                msg = self.conn.recv()
                if msg[0] == "reply":
                    fut = self._replies.get(msg[1])
                    if fut is not None and not fut.done():
                        (fut.set_result if msg[2] else fut.set_exception)(msg[3])
                elif self._proxy is not None:
                    self._proxy.on_engine(msg)
        except (EOFError, OSError):
            self._died()

    def _died(self) -> None:
        loop = self._loop
        if loop is None or self.proc is None:
            return
        for fd in (self.conn.fileno(), self.proc.sentinel):
            loop.remove_reader(fd)
        self.proc.join(1)
        why = f"the engine process exited with code {self.proc.exitcode}"
        log.error("%s", why)
        self._loop = None
        self._fail_replies(ActorStopped(why))
        if self._proxy is not None:
            self._proxy.lost(why)
        self._proxy = None


class _Crash:
    def __init__(self, exc: BaseException):
        self.exc = exc


class RemoteStalls:
    """The engine's loop stalls, as `StallWatch` offers them."""

    def __init__(self, keep: int = 64):
        self.stalls: collections.deque = collections.deque(maxlen=keep)

    def since(self, t: float) -> list:
        return [s for s in self.stalls if s.release >= t]


class ClockProxy(Actor):
    """The node's "clock" when the clock runs in the engine process (see the module's doc)."""

    def __init__(self, host: EngineHost, epoch: int, endpoint: str, policy, start_policy,
                 keep_records: bool, on_beat: Callable[[BeatRecord], None] | None):
        super().__init__("clock")
        self.host, self.epoch, self.endpoint = host, epoch, endpoint
        self.policy, self.start_policy, self._keep_records = policy, start_policy, keep_records
        self._on_beat = on_beat
        self.stats = ClockStats()
        self.stalls = RemoteStalls()
        self.jitter_totals = SimpleNamespace(underruns=0, dropped=0)
        self.free_slots = host.max_sessions
        self.reports_lost = 0          # beat reports the engine dropped: this loop was not reading
        self.outputs_shared = False    # the engine's outputs lie in memory the workers map
        self.frames_shared = False     # the workers' frames lie in memory the engine maps
        self.frames_overwritten = 0    # of those, rewritten before their beat (heard silent)
        self.frames_read_by_executor = False   # read from the ring by the executor, ungathered
        self.snapshot_stats: dict | None = None   # the engine clock's index, at its last beat
        self._ready: dict[Handle, asyncio.Future] = {}
        # Created here (a supervisor starts its children from the running loop): asks made
        # before the engine's clock has started wait for it.
        self._started = asyncio.get_running_loop().create_future()
        self._stopped: asyncio.Future | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    async def on_start(self) -> None:
        if not self.host.alive:
            log.warning("engine: starting a new engine process")
            await self.host.restart()
        self.host.attach(self)
        self.host.send(("clock_start", self.epoch, self.endpoint, self.policy, self.start_policy,
                        self._keep_records))
        await within(self._started, START_TIMEOUT_S)

    async def on_stop(self) -> None:
        if self.host.alive and self.host._proxy is self:
            self._stopped = asyncio.get_running_loop().create_future()
            try:
                self.host.send(("clock_stop", self.epoch))
                await within(self._stopped, STOP_TIMEOUT_S)
            except (ActorStopped, asyncio.TimeoutError) as exc:
                log.warning("engine: the clock did not stop cleanly: %r", exc)
        if self.host._proxy is self:
            self.host.detach()                      # the next incarnation attaches again
        if not self._started.done():
            self._started.set_exception(ActorStopped(self.name))
            self._started.exception()               # read: an unasked start is no error
        for fut in self._ready.values():
            if not fut.done():
                fut.set_result(False)       # openers learn at once that their start is gone
        self._ready.clear()

    def lost(self, why: str) -> None:
        """The engine process died under this incarnation."""
        if not self.stopped.is_set():
            self.tell(_Crash(ActorStopped(why)))

    # -- the clock's surface ----------------------------------------------------------------------
    def tell(self, msg: Any, cls: MsgClass = MsgClass.CONTROL) -> None:
        if isinstance(msg, FunctionTokens):
            if self.stopped.is_set():
                raise ActorStopped(self.name)
            self.host.send(("tokens", self.epoch, msg.handle, list(msg.ids)))
            return
        super().tell(msg, cls)

    async def ask(self, msg: Any, timeout: float = ASK_TIMEOUT_S) -> Any:
        if self.stopped.is_set():
            raise ActorStopped(self.name)
        if isinstance(msg, (Admit, Release)) and not self._started.done():
            await within(asyncio.shield(self._started), START_TIMEOUT_S)
        if isinstance(msg, Admit):
            handle = await self.host.request("admit", self.epoch, msg.key, msg.spec,
                                             timeout=timeout)
            self._ready.setdefault(handle, asyncio.get_running_loop().create_future())
            return handle
        if isinstance(msg, Release):
            try:
                return await self.host.request("release", self.epoch, msg.handle,
                                               msg.stream_ended, timeout=timeout)
            finally:
                fut = self._ready.pop(msg.handle, None)
                if fut is not None and not fut.done():
                    fut.set_result(False)
        return await super().ask(msg, timeout)

    def when_ready(self, handle: Handle) -> asyncio.Future:
        fut = self._ready.get(handle)
        if fut is None:
            fut = self._ready[handle] = asyncio.get_running_loop().create_future()
        return fut

    def bind(self, handle: Handle, worker: bytes, rid: int) -> None:
        """Where this session's outputs go: its worker's socket and the front's number for it."""
        self.host.send(("bind", self.epoch, handle, worker, rid))

    async def handle(self, msg: Any) -> Any:
        if isinstance(msg, _Crash):
            raise msg.exc
        raise TypeError(f"unexpected message {type(msg).__name__}")

    # -- from the engine --------------------------------------------------------------------------
    def on_engine(self, msg: tuple) -> None:
        op, epoch = msg[0], msg[1]
        if epoch != self.epoch:
            return                                  # an earlier incarnation's
        if op == "beat":
            self._beat(*msg[2:])
        elif op == "ready":
            fut = self.when_ready(msg[2])
            if not fut.done():
                fut.set_result(msg[3])
        elif op == "started":
            if self._started is not None and not self._started.done():
                self._started.set_result(None)
        elif op == "stopped":
            self.start_policy = msg[2]              # its counters, as the engine left them
            if self._stopped is not None and not self._stopped.done():
                self._stopped.set_result(None)
        elif op == "crashed":
            log.error("engine: the clock crashed: %s", msg[2])
            if not self.stopped.is_set():
                self.tell(_Crash(RuntimeError(f"the engine's clock crashed: {msg[2]}")))

    def _beat(self, rec: BeatRecord, totals: dict, stalls: list) -> None:
        self.jitter_totals.underruns = totals["underruns"]
        self.jitter_totals.dropped = totals["dropped"]
        self.stats.dropped_frames = totals["dropped_frames"]
        self.stats.unroutable = totals["unroutable"]
        self.free_slots = totals["free_slots"]
        self.outputs_shared = totals["outputs_shared"]
        self.frames_shared = totals["frames_shared"]
        self.frames_overwritten = totals["frames_overwritten"]
        self.frames_read_by_executor = totals["frames_read_by_executor"]
        self.snapshot_stats = totals["snapshots"]
        if totals["reports_lost"] > self.reports_lost:
            log.warning("engine: %d beat reports dropped while this process did not read them "
                        "(its records and metrics miss those beats)",
                        totals["reports_lost"] - self.reports_lost)
            self.reports_lost = totals["reports_lost"]
        self.stalls.stalls.extend(stalls)
        if self.stats.add(rec, self._keep_records) and self._on_beat:
            self._on_beat(rec)
