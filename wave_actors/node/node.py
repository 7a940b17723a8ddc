"""The node: one process per GPU. Binds the wire protocol's ROUTER, admits sessions into slots,
hosts its sessions (`sessions/hosts.py`: in this process or in workers) and runs one
BeatClockActor, under a one_for_one supervisor.

The node keeps one map: a client's (identity, session id) → its route (the session's handle,
its actor, the key that opened it, the connection it is bound to, its resume token). Slots,
generations and model liveness belong to the clock's session table; the node holds handles and
asks. If the supervisor gives up on the clock (restarts too often), the node drains and `failed`
says why: the CLI then exits non-zero.

Client liveness (the Paranoid Pirate pattern): a session follows the connection that opened or
last resumed it (`gatekeeper.py` numbers connections). It is detached — its outputs held or
counted, its inputs refused — when that connection is gone (a probe at a new connection finds
none, or the client sent nothing for `heartbeat_liveness` heartbeats), and never detached or
closed by a failed send. A detached session resumes with `resume` (its token, or the
CURVE key that opened it) within `resume_grace_s`, else it closes. A session that hears nothing
of its own (audio, a function result, a ping naming it) for `idle_timeout_s` closes too.

The front (this module) owns the public socket; `inbound.py` reads it (every message parsed,
malformed input answered with `error`, never crashing, never touching another session; floods
rate-limited per client; typed messages handed to the actors) and `outbound.py` sends on it.
`python -m wave_actors.node` serves until SIGINT/SIGTERM, then drains: new opens are refused,
every session gets `closed`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import zmq
import zmq.asyncio
import zmq.auth

from transports import protocol as P
from transports import zsock
from wave_actors.node.bindings import Bindings, Route
from wave_actors.clock.beat_stats import BeatRecord
from wave_actors.clock.clock import BeatClockActor, FunctionTokens, Release
from wave_actors.clock.routes import ToSessions
from wave_actors.core.contract import Executor, Handle
from wave_actors.core.sched.start_policy import GuardedStarts
from wave_actors.core.timebase import Clock
from wave_actors.core.tasks import stop_tasks
from wave_actors.engine.host import ClockProxy, EngineHost
from wave_actors.engine.process import ExecutorSpec
from wave_actors.node.config import NodeConfig, NodeCounters, close_stats
from wave_actors.node.flood import FloodGate
from wave_actors.node.gatekeeper import DOMAIN, Gatekeeper
from wave_actors.node.inbound import Inbound
from wave_actors.node.outbound import Outbound
from wave_actors.node.warm import WarmReport, warm_again, warm_at_start
from wave_actors.runtime.metrics import NodeMetrics
from wave_actors.runtime.proc_cpu import cpu_seconds
from wave_actors.runtime.actors import (ActorStopped, ChildSpec, MailboxFull, MsgClass, Restart,
                                        Supervisor)
from wave_actors.clock.shared_outputs import BeatOut
from wave_actors.sessions.hosts import HostedSession, HostEvents, make_host
from wave_actors.sessions.messages import Close

log = logging.getLogger("wave.node")
CLOSE_LINGER_MS = 500       # the last `closed`/`refused` replies get this long to leave at exit


class Node:
    def __init__(self, cfg: NodeConfig, executor: Executor | EngineHost | ExecutorSpec,
                 clock: Clock | None = None, ctx: zmq.asyncio.Context | None = None):
        """`executor`: one in this process (no workers), or with workers the engine process
        that holds it: an `EngineHost` the caller started (and closes), or an `ExecutorSpec`
        for the node to start and close."""
        self._own_engine = isinstance(executor, ExecutorSpec)
        if self._own_engine:
            executor = EngineHost(executor)
        if (cfg.workers > 0) != isinstance(executor, EngineHost):
            raise ValueError("a node with session workers runs its executor in an engine process "
                             "(pass an ExecutorSpec or EngineHost); one without runs it here")
        self.cfg, self.executor = cfg, executor
        self.engine: EngineHost | None = executor if isinstance(executor, EngineHost) else None
        self.clock = clock or Clock()
        self.ctx = ctx or zmq.asyncio.Context()
        self.metrics = NodeMetrics()
        self.counters = NodeCounters()
        self.supervisor = Supervisor()
        self.start_policy = cfg.start_policy or GuardedStarts()
        self.bindings = Bindings()
        self.flood = FloodGate(cfg.flood)
        self._clock_incarnation = 0
        self._underruns_reported = 0
        self.draining = False
        self._drain_begun = False
        self.failed: str | None = None      # why the node stopped itself (supervisor gave up)
        # each called with ("opened" or "closed", the session's id) as a session does so
        self.session_listeners: list = []
        self.stopped = asyncio.Event()      # drained, by a signal or by failure
        self.sock: zmq.asyncio.Socket | None = None
        self.gatekeeper: Gatekeeper | None = None
        self._tasks: list[asyncio.Task] = []
        self.opens: set[asyncio.Task] = set()
        self._watcher: asyncio.Task | None = None
        self.out = Outbound(self)
        # where sessions run: in this process, or in cfg.workers session workers
        self.host = make_host(cfg.workers, self.supervisor, lambda: self.clock_actor, self.ctx,
                              lambda: (executor.text_codec, executor.user_codec), self.clock,
                              cfg.clock_policy,
                              HostEvents(self.out.to_route, self._finish, self._failed,
                                         self._function_tokens, self._stale_rows,
                                         self.spawn))
        self._clock_base = cfg.clock_endpoint
        self.inbound = Inbound(self)
        self.warmed: WarmReport | None = None       # the last warm-up's (None: none ran)

    @property
    def clock_actor(self) -> BeatClockActor:
        return self.supervisor.get("clock")

    @property
    def routes(self) -> dict[tuple[bytes, str], Route]:
        return self.bindings.routes

    @property
    def sessions(self) -> dict[tuple[bytes, str], HostedSession]:
        """The opened sessions' actors by (identity, session id)."""
        return {key: r.actor for key, r in self.routes.items() if r.actor is not None}

    def describe(self) -> dict:
        """Facts printed at start and recorded in results: the executor's and the policies'."""
        facts = {**self.executor.describe(), "start_policy": self.start_policy.describe(),
                 "clock_policy": self.cfg.clock_policy.describe()}
        if self.warmed is not None:
            facts["warm_prompts"] = {"asked": self.warmed.asked, "ready": self.warmed.ready,
                                     "seconds": round(self.warmed.seconds, 3)}
        return facts

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.cfg
        if self._own_engine and not self.engine.alive:
            await asyncio.get_running_loop().run_in_executor(None, self.engine.start)
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # No ROUTER_HANDOVER: a connection cannot take the routing identity of a live one.
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 10_000)
        self.sock.setsockopt(zmq.SNDHWM, cfg.send_hwm)
        self.sock.setsockopt(zmq.MAXMSGSIZE, P.TRANSPORT_MAX_BYTES)
        # ZMTP heartbeats end a half-open connection (a peer gone without a FIN), so the
        # client's reconnect under its identity is not refused as a duplicate for long.
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, int(1000 * cfg.heartbeat_s))
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(1000 * cfg.silence_limit_s))
        self.sock.setsockopt(zmq.ZAP_DOMAIN, DOMAIN)
        curve = Path(cfg.curve_keys) if cfg.curve_keys else None
        self.gatekeeper = Gatekeeper(self.ctx, self.out.probe_bound,
                                     curve / "clients" if curve else None)
        self.gatekeeper.start()
        if curve is not None:
            public, secret = zmq.auth.load_certificate(curve / "server.key_secret")
            if secret is None:
                raise ValueError(f"{curve / 'server.key_secret'} holds no secret key")
            self.sock.curve_secretkey = secret
            self.sock.curve_publickey = public
            self.sock.curve_server = True
        self.sock.bind(cfg.bind)
        self.tx = zsock.Tx(self.sock)
        await self.host.start()
        self._clock_base = self.host.clock_base(cfg.clock_endpoint)
        self.supervisor.start_child(ChildSpec("clock", self._make_clock, Restart.PERMANENT,
                                              self._clock_crashed))
        if cfg.metrics_port:
            self.metrics.serve(cfg.metrics_port)
        # Before the socket is read: opens sent meanwhile wait in it, then find the snapshots.
        await warm_at_start(self)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self.inbound.run()))
        self._tasks.append(loop.create_task(self._watch_liveness()))
        self._watcher = loop.create_task(self._watch_supervisor())
        self.update_gauges()

    async def _watch_supervisor(self) -> None:
        """The supervisor gave up on the clock: no beat will run again, so every session is
        closed and the node stops (the CLI exits non-zero with the reason)."""
        await self.supervisor.failed.wait()
        self.failed = f"the engine failed: {self.supervisor.failure}"
        log.error("%s; draining", self.failed)
        await self.drain()

    def _make_clock(self) -> BeatClockActor:
        # A fresh inproc address per incarnation: a dead clock's socket may still hold its own.
        self._clock_incarnation += 1
        if self._clock_incarnation > 1 and self.warmed is not None:
            self.spawn(warm_again(self))        # the snapshots went with the last incarnation
        endpoint = f"{self._clock_base}-{id(self)}-{self._clock_incarnation}"
        if self.engine is not None:
            return ClockProxy(self.engine, self._clock_incarnation, endpoint,
                              self.cfg.clock_policy, self.start_policy, self.cfg.keep_records,
                              self._on_beat)
        return BeatClockActor(self.executor, self.ctx, endpoint, self.clock,
                              ToSessions(self._deliver),
                              self.cfg.clock_policy, self.start_policy, self._clock_incarnation,
                              self._on_beat, self.cfg.keep_records)

    async def _clock_crashed(self, clock: BeatClockActor, exc: BaseException) -> None:
        """The slot table died with the clock: every live session ends, with an error."""
        for route in list(self.routes.values()):
            if route.actor is None:
                continue
            self.out.to_route(route, P.error_frames(
                P.INTERNAL, f"engine restarted after a fault: {type(exc).__name__}", route.session))
            try:
                route.actor.tell(Close("crash"))
            except (ActorStopped, MailboxFull):
                pass

    @property
    def endpoint(self) -> str:
        return self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    async def drain(self, timeout: float = 5.0) -> None:
        """Refuse new sessions, close every live one with `closed`, stop the actors. The front
        keeps reading until the socket closes, so an `open` sent meanwhile is answered
        `refused draining`, and the last replies get CLOSE_LINGER_MS to leave."""
        if self._drain_begun:                           # a second caller waits for the first
            await self.stopped.wait()
            return
        self._drain_begun = self.draining = True
        for route in list(self.routes.values()):
            if route.ready is not None and not route.ready.done():
                route.ready.cancel()                     # their openers answer `draining`
        for actor in list(self.sessions.values()):
            try:
                actor.tell(Close("drain"))
            except (ActorStopped, MailboxFull):
                pass
        began = self.clock.now()
        deadline = began + timeout
        while (self.sessions or self.opens or self.clock.now() < began + self.cfg.drain_grace_s) \
                and self.clock.now() < deadline:
            await asyncio.sleep(0.02)
        if self._watcher is not None and self._watcher is not asyncio.current_task():
            self._watcher.cancel()
        await self.supervisor.stop_all()
        await self.host.stop()
        if self._own_engine:
            await asyncio.get_running_loop().run_in_executor(None, self.engine.close)
        # The front reads (and refuses opens) until here: nothing below waits on the loop.
        await stop_tasks(self._tasks)
        if self.gatekeeper is not None:
            await self.gatekeeper.stop()
        self.tx.close(CLOSE_LINGER_MS)
        self.stopped.set()

    async def _watch_liveness(self) -> None:
        cfg = self.cfg
        period = min(cfg.heartbeat_s, cfg.resume_grace_s, cfg.idle_timeout_s) / 4
        while True:
            await self.clock.sleep(period)
            now = self.clock.now()
            for route, reason in self.bindings.due(now, cfg.silence_limit_s, cfg.idle_timeout_s,
                                                   cfg.resume_grace_s):
                self._tell_close(route.actor, reason)
            self.bindings.forget_quiet_peers(now, cfg.silence_limit_s,
                                             4 * self.executor.max_sessions)

    @staticmethod
    def _tell_close(actor: HostedSession, reason: str) -> None:
        try:
            actor.tell(Close(reason))
        except (ActorStopped, MailboxFull):
            pass

    def _deliver(self, route: Route, out: BeatOut) -> bool:
        """The clock's route for a session's beat outputs: into its actor's mailbox. A warm-up
        session (`warm.py`) has no route: nobody hears it, by design."""
        if route is None:
            return True
        if route.actor is None:
            return False
        try:
            route.actor.tell(out, MsgClass.AUDIO)
        except ActorStopped:
            return False
        return True

    def _function_tokens(self, handle: Handle, ids: list[int]) -> None:
        clock = self.clock_actor
        if clock is not None:
            clock.tell(FunctionTokens(handle, ids))

    # -- closing ----------------------------------------------------------------------------------
    async def _finish(self, route: Route, session: HostedSession, reason: str) -> None:
        """Close a session wherever it runs: its stream ended, its slot freed, `closed` sent.
        `closed.stats` counts in 80 ms frames: `dropped` is the input frames never heard
        (`dropped_in`) plus the output frames the client did not get (`dropped_out`)."""
        host = self.host
        ended = await host.end_stream(session)
        slot_stats = await self.free_slot(session.cfg.handle, ended)
        drops = await host.input_drops(session, ended)
        sent, dropped_out = host.sent(session)
        # audio the front queued for a slow client and shed since: not sent after all
        stats = close_stats(slot_stats, drops, sent - route.shed_out,
                             dropped_out + route.shed_out)
        self.metrics.closed_lost(slot_stats, drops, stats["dropped_out"])
        host.forget(route, session)
        # A detached session's `closed` waits for its client's resume (which fetches it).
        self.out.to_route(route, P.pack("closed", route.session, stats=stats))
        self.bindings.forget(route, stats)
        self.counters.closed += 1
        self.metrics.closed.labels(reason).inc()
        for listen in self.session_listeners:
            listen("closed", route.session)
        self.update_gauges()

    async def _failed(self, route: Route, session: HostedSession, message: str) -> None:
        """A session's actor or its worker failed: its client is told, and it closes."""
        self.counters.crashed += 1
        if session.closing:
            return
        session.closing = True
        self.out.to_route(route, P.error_frames(P.INTERNAL, message, route.session))
        await self._finish(route, session, "crash")

    async def free_slot(self, handle: Handle, stream_ended: bool = False):
        """The clock's stats of the session it frees, or None: a handle of an earlier clock
        incarnation (whose table went with it) or already released is stale, and counted."""
        try:
            stats = await self.clock_actor.ask(Release(handle, stream_ended))
        except Exception as exc:     # the clock restarting: the slot table went with it
            log.warning("release of %s failed: %r", handle, exc)
            return None
        if stats is None:
            self.counters.stale += 1
        return stats

    def _stale_rows(self, rows: int) -> None:
        """A worker read a beat's outputs only after the engine refilled them: those sessions
        miss that beat's audio (counted; the next beat comes as usual)."""
        self.counters.stale_rows += rows
        self.metrics.drops.labels("output_overwritten").inc(rows)

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(lambda t: t in self._tasks and self._tasks.remove(t))
        return task

    # -- metrics ----------------------------------------------------------------------------------
    def _on_beat(self, rec: BeatRecord) -> None:
        m = self.metrics
        m.beats.inc()
        m.beat_latency.observe(rec.latency_s)
        if rec.late:
            m.late_beats.inc()
        clock = self.clock_actor
        if clock is not None:
            m.snapshots(clock.snapshot_stats)
            total = clock.jitter_totals.underruns
            if total > self._underruns_reported:
                m.underruns.inc(total - self._underruns_reported)
                self._underruns_reported = total

    def update_gauges(self) -> None:
        live = len(self.sessions)
        self.metrics.sessions.set(live)
        self.metrics.free_slots.set(self.executor.max_sessions - live)

    def process_cpu(self) -> dict:
        """CPU seconds so far of this process (the front) and of the node's other processes
        (None where unknown): a bench takes two of these around its measured beats."""
        out = {"front": time.process_time(), "engine": None, "workers": []}
        if self.engine is not None and self.engine.proc is not None:
            out["engine"] = cpu_seconds(self.engine.proc.pid)
        out["workers"] = self.host.cpu_seconds()
        return out

    def status(self) -> dict:
        clock = self.clock_actor
        lat = sorted(clock.stats.recent) if clock else []
        pct = (lambda q: 1000 * lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0)
        totals = clock.jitter_totals if clock else None
        return {"sessions": len(self.sessions),
                "beats": clock.stats.beats if clock else 0,
                "p50_ms": pct(0.5), "p99_ms": pct(0.99),
                "late_beats": clock.stats.late_beats if clock else 0,
                "underruns": totals.underruns if totals else 0,
                "dropped": totals.dropped if totals else 0,
                "refusals": sum(self.counters.refusals.values()),
                "errors": sum(self.counters.errors.values())}

