"""The node: one process per GPU. Binds the wire protocol's ROUTER, admits sessions into slots,
runs one SessionActor per session and one BeatClockActor, under a one_for_one supervisor.

The node keeps one map: a client's (identity, session id) → its route (the session's handle,
its actor, the key that opened it). Slots, generations and liveness belong to the clock's
session table; the node holds handles and asks. If the supervisor gives up on the clock
(restarts too often), the node drains and `failed` says why: the CLI then exits non-zero.

The front (this module) owns the public socket: it parses every message with `protocol.parse`,
answers malformed input with `error` (never crashing, never touching another session), rate-limits
floods per client, and hands typed messages to the actors. `python -m wave_actors.node` serves
until SIGINT/SIGTERM, then drains: new opens are refused, every session gets `closed`.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from transports import protocol as P
from transports import zsock
from wave_actors.clock import Admit, BeatClockActor, BeatRecord, FunctionTokens, Release
from wave_actors.core.clock_policy import ClockPolicy
from wave_actors.core.contract import Executor, Handle, SessionSpec
from wave_actors.core.jitter import CapacityError
from wave_actors.core.start_policy import StartPolicy
from wave_actors.core.timebase import Clock
from wave_actors.metrics import NodeMetrics
from wave_actors.runtime import ActorStopped, ChildSpec, MailboxFull, MsgClass, Restart, Supervisor
from wave_actors.session import (AudioIn, BeatOut, Close, FunctionResult, SessionActor,
                                 SessionConfig)

log = logging.getLogger("wave.node")
SEND_TIMEOUT_S = 5.0


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    bind: str = "tcp://127.0.0.1:5555"
    max_sessions: int = 8
    clock_policy: ClockPolicy = field(default_factory=ClockPolicy)
    start_policy: StartPolicy | None = None     # None: the executor's default
    idle_timeout_s: float = 10.0         # a client silent this long is gone
    start_timeout_s: float = 60.0        # an admitted session's start (prefill) must end by then
    curve_keys: str | None = None        # directory: server.key_secret + clients/*.key
    metrics_port: int | None = None
    clock_endpoint: str = "inproc://wave-clock"
    flood_rate: float = 500.0            # messages/s per client and per live session of it
    flood_burst: float = 1000.0
    keep_records: bool = True            # keep every beat's record (bench, tests)


def _zero_stats() -> dict:
    return {"frames_in": 0, "frames_out": 0, "underruns": 0, "dropped": 0, "late_beats": 0}


@dataclass
class _Bucket:
    tokens: float
    stamp: float
    warned: float = -1e9


@dataclass
class NodeCounters:
    errors: dict = field(default_factory=dict)
    stale: int = 0                      # messages naming a session handle no longer current
    refusals: dict = field(default_factory=dict)
    flood_drops: int = 0
    opened: int = 0
    closed: int = 0
    crashed: int = 0


@dataclass(eq=False)
class _Route:
    """One client session, from its `open` until it is forgotten."""
    identity: bytes
    session: str
    owner_key: str | None               # the CURVE key that opened it (None without CURVE)
    handle: Handle | None = None        # once admitted
    actor: SessionActor | None = None   # once opened
    ready: asyncio.Future | None = None     # while its start runs
    cancelled: bool = False             # closed by its client before `opened`


class Node:
    def __init__(self, cfg: NodeConfig, executor: Executor, clock: Clock | None = None,
                 ctx: zmq.asyncio.Context | None = None):
        self.cfg, self.executor = cfg, executor
        self.clock = clock or Clock()
        self.ctx = ctx or zmq.asyncio.Context()
        self.metrics = NodeMetrics()
        self.counters = NodeCounters()
        self.supervisor = Supervisor()
        self.start_policy = cfg.start_policy or executor.default_start_policy()
        self.routes: dict[tuple[bytes, str], _Route] = {}
        self._sessions_of: dict[bytes, int] = {}            # live sessions per client
        self._clock_incarnation = 0
        self._underruns_reported = 0
        self._last_seen: dict[bytes, float] = {}
        self._buckets: dict[bytes, _Bucket] = {}
        self.draining = False
        self._drain_begun = False
        self.failed: str | None = None      # why the node stopped itself (supervisor gave up)
        self.stopped = asyncio.Event()      # drained, by a signal or by failure
        self.sock: zmq.asyncio.Socket | None = None
        self._auth = None
        self._tasks: list[asyncio.Task] = []
        self._watcher: asyncio.Task | None = None

    @property
    def clock_actor(self) -> BeatClockActor:
        return self.supervisor.get("clock")

    @property
    def sessions(self) -> dict[tuple[bytes, str], SessionActor]:
        """The opened sessions' actors by (identity, session id)."""
        return {key: r.actor for key, r in self.routes.items() if r.actor is not None}

    def describe(self) -> dict:
        """Facts printed at start and recorded in results: the executor's and the policies'."""
        return {**self.executor.describe(), "start_policy": self.start_policy.describe(),
                "clock_policy": self.cfg.clock_policy.describe()}

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # A bridge that reconnects under its identity takes its sessions over at once; with
        # CURVE, each session still answers only to the key that opened it.
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 10_000)
        self.sock.setsockopt(zmq.SNDHWM, 10_000)
        self.sock.setsockopt(zmq.MAXMSGSIZE, P.MAX_PAYLOAD_BYTES + P.MAX_HEADER_BYTES)
        if self.cfg.curve_keys:
            await self._setup_curve(Path(self.cfg.curve_keys))
        self.sock.bind(self.cfg.bind)
        self._tx = zsock.Tx(self.sock)
        self.supervisor.start_child(ChildSpec("clock", self._make_clock, Restart.PERMANENT,
                                              self._clock_crashed))
        if self.cfg.metrics_port:
            self.metrics.serve(self.cfg.metrics_port)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._recv_loop()))
        self._watcher = loop.create_task(self._watch_supervisor())
        self._update_gauges()

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
        endpoint = f"{self.cfg.clock_endpoint}-{id(self)}-{self._clock_incarnation}"
        return BeatClockActor(self.executor, self.ctx, endpoint, self.clock, self._deliver,
                              self.cfg.clock_policy, self.start_policy, self._clock_incarnation,
                              self._on_beat, self.cfg.keep_records)

    async def _clock_crashed(self, clock: BeatClockActor, exc: BaseException) -> None:
        """The slot table died with the clock: every live session ends, with an error."""
        for actor in list(self.sessions.values()):
            self._error(actor.cfg.identity, P.INTERNAL, f"engine restarted after a fault: "
                        f"{type(exc).__name__}", actor.cfg.session)
            try:
                actor.tell(Close("crash"))
            except (ActorStopped, MailboxFull):
                pass

    async def _setup_curve(self, keydir: Path) -> None:
        import zmq.auth
        from zmq.auth.asyncio import AsyncioAuthenticator
        public, secret = zmq.auth.load_certificate(keydir / "server.key_secret")
        if secret is None:
            raise ValueError(f"{keydir / 'server.key_secret'} holds no secret key")
        self._auth = AsyncioAuthenticator(self.ctx)
        self._auth.start()
        self._auth.configure_curve(domain="*", location=str(keydir / "clients"))
        self.sock.curve_secretkey = secret
        self.sock.curve_publickey = public
        self.sock.curve_server = True

    @property
    def endpoint(self) -> str:
        return self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    async def drain(self, timeout: float = 5.0) -> None:
        """Refuse new sessions, close every live one with `closed`, stop the actors."""
        if self._drain_begun:                           # a second caller waits for the first
            await self.stopped.wait()
            return
        self._drain_begun = self.draining = True
        for route in list(self.routes.values()):
            if route.ready is not None and not route.ready.done():
                route.ready.cancel()                     # their openers answer `draining`
        actors = list(self.sessions.values())
        for actor in actors:
            try:
                actor.tell(Close("drain"))
            except (ActorStopped, MailboxFull):
                pass
        deadline = self.clock.now() + timeout
        while self.sessions and self.clock.now() < deadline:
            await asyncio.sleep(0.02)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._watcher is not None and self._watcher is not asyncio.current_task():
            self._watcher.cancel()
        await self.supervisor.stop_all()
        if self._auth:
            self._auth.stop()
        self.sock.close(0)
        self.stopped.set()

    # -- outbound ---------------------------------------------------------------------------------
    def send(self, identity: bytes, frames: list[bytes], droppable: bool = False) -> bool:
        """Send to a client without blocking the node. A client that is not reading loses
        `droppable` messages (audio, counted); anything else waits for it in a task, bounded
        by SEND_TIMEOUT_S. False when the message did not go out now."""
        try:
            self._tx.send([identity, *frames])
            return True
        except zmq.ZMQError as exc:
            unreachable = exc.errno == zmq.EHOSTUNREACH
        if unreachable:
            self._client_lost(identity)
            self.metrics.drops.labels("client_gone").inc()
            return False
        if droppable:
            self.metrics.drops.labels("client_not_reading").inc()
            return False
        task = asyncio.get_running_loop().create_task(self._send_later(identity, frames))
        self._tasks.append(task)
        task.add_done_callback(lambda t: t in self._tasks and self._tasks.remove(t))
        return False

    async def _send_later(self, identity: bytes, frames: list[bytes]) -> None:
        try:
            await asyncio.wait_for(self.sock.send_multipart([identity, *frames]), SEND_TIMEOUT_S)
        except (asyncio.TimeoutError, zmq.ZMQError):
            self.metrics.drops.labels("client_not_reading").inc()

    def _error(self, identity: bytes, code: str, message: str, session: str | None = None) -> None:
        self.counters.errors[code] = self.counters.errors.get(code, 0) + 1
        self.metrics.errors.labels(code).inc()
        self.send(identity, P.error_frames(code, message, session))

    def _refuse(self, identity: bytes, session: str, reason: str, message: str) -> None:
        self.counters.refusals[reason] = self.counters.refusals.get(reason, 0) + 1
        self.metrics.refusals.labels(reason).inc()
        self.send(identity, P.pack("refused", session, reason=reason, message=message))

    def _client_lost(self, identity: bytes) -> None:
        for (ident, _sid), actor in self.sessions.items():
            if ident == identity and not actor.closing:
                try:
                    actor.tell(Close("lost"))
                except (ActorStopped, MailboxFull):
                    pass

    # -- inbound ----------------------------------------------------------------------------------
    async def _recv_loop(self) -> None:
        async for batch in zsock.batches(self.sock, self._tx.sync, copy=False):
            for raw in batch:
                try:
                    self._on_frames(raw)
                except Exception:
                    # The front survives anything a peer sends; a bug here is logged and counted.
                    log.exception("front: unexpected failure handling a message")
                    self.metrics.errors.labels(P.INTERNAL).inc()

    def _on_frames(self, raw: list) -> None:
        identity = raw[0].bytes
        user_key = raw[0].get("User-Id") if self.cfg.curve_keys else None
        now = self.clock.now()
        self._last_seen[identity] = now
        try:
            msg = P.parse([f.bytes for f in raw[1:]])
        except P.ProtocolError as exc:
            if self._admit_rate(identity, now):
                self._reply_protocol_error(identity, exc)
            return
        # `close` is never rate-limited: shedding load must not keep a session alive.
        if msg.type != "close" and not self._admit_rate(identity, now):
            return
        getattr(self, f"_on_{msg.type}")(identity, user_key, msg)

    def _reply_protocol_error(self, identity: bytes, exc: P.ProtocolError) -> None:
        if exc.msg_type == "open" and exc.session:
            # The opener waits for opened/refused: answer in those terms, and count it.
            self.counters.errors[exc.code] = self.counters.errors.get(exc.code, 0) + 1
            self.metrics.errors.labels(exc.code).inc()
            self._refuse(identity, exc.session, "invalid", exc.message)
        else:
            self._error(identity, exc.code, exc.message, exc.session)

    def _admit_rate(self, identity: bytes, now: float) -> bool:
        """Token bucket per client, sized by its live sessions (a bridge carrying 200 calls may
        send 200 times what a single call does)."""
        b = self._buckets.get(identity)
        if b is None:
            if len(self._buckets) > 10_000:        # forget quiet clients; bounded memory
                self._prune(now)
            b = self._buckets[identity] = _Bucket(self.cfg.flood_burst, now)
        scale = 1 + self._sessions_of.get(identity, 0)
        b.tokens = min(self.cfg.flood_burst * scale,
                       b.tokens + (now - b.stamp) * self.cfg.flood_rate * scale)
        b.stamp = now
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return True
        self.counters.flood_drops += 1
        self.metrics.drops.labels("flood").inc()
        if now - b.warned > 1.0:
            b.warned = now
            self._error(identity, P.OVERLOADED, "too many messages from this client; messages "
                                                "are being dropped")
        return False

    def _prune(self, now: float) -> None:
        live = {ident for ident, _ in self.sessions}
        for ident in [i for i, b in self._buckets.items()
                      if i not in live and now - b.stamp > self.cfg.idle_timeout_s]:
            self._buckets.pop(ident, None)
            self._last_seen.pop(ident, None)

    def _on_ping(self, identity: bytes, user_key, msg: P.Message) -> None:
        self.send(identity, P.pack("pong", nonce=msg.get("nonce")))

    def _session_for(self, identity: bytes, user_key, msg: P.Message) -> SessionActor | None:
        route = self.routes.get((identity, msg.session))
        actor = route.actor if route is not None else None
        if actor is None or actor.closing:
            self._error(identity, P.UNKNOWN_SESSION, f"no live session {msg.session!r} on this "
                                                     "connection", msg.session)
            return None
        if route.owner_key != user_key:
            self._error(identity, P.FORBIDDEN, "this session belongs to another key", msg.session)
            return None
        return actor

    def _on_audio(self, identity: bytes, user_key, msg: P.Message) -> None:
        actor = self._session_for(identity, user_key, msg)
        if actor is not None:
            actor.tell(AudioIn(msg.header["seq"], msg.payload), MsgClass.AUDIO)

    def _on_function_result(self, identity: bytes, user_key, msg: P.Message) -> None:
        actor = self._session_for(identity, user_key, msg)
        if actor is not None:
            self._tell_control(identity, actor, FunctionResult(msg.get("call_id"), msg.get("output")))

    def _on_close(self, identity: bytes, user_key, msg: P.Message) -> None:
        route = self.routes.get((identity, msg.session))
        if route is not None and route.actor is None and route.owner_key == user_key:
            # Closed before `opened`: its open stops (cancelling its start, freeing its slot)
            # and answers `closed`.
            route.cancelled = True
            if route.ready is not None and not route.ready.done():
                route.ready.cancel()
            return None
        actor = self._session_for(identity, user_key, msg)
        if actor is not None:
            self._tell_control(identity, actor, Close("client"))

    def _tell_control(self, identity: bytes, actor: SessionActor, msg: Any) -> None:
        try:
            actor.tell(msg)
        except (ActorStopped, MailboxFull) as exc:
            self._error(identity, P.OVERLOADED, f"session cannot take messages: {exc}",
                        actor.cfg.session)

    def _on_open(self, identity: bytes, user_key, msg: P.Message) -> None:
        key = (identity, msg.session)
        if self.draining:
            return self._refuse(identity, msg.session, "draining", "the node is shutting down")
        if key in self.routes:
            return self._refuse(identity, msg.session, "duplicate",
                                f"session {msg.session!r} is already open on this connection")
        route = self.routes[key] = _Route(identity, msg.session, user_key)
        asyncio.get_running_loop().create_task(self._open(route, msg))

    async def _open(self, route: _Route, msg: P.Message) -> None:
        identity, key = route.identity, (route.identity, msg.session)
        h = msg.header
        clock = self.clock_actor
        try:
            handle = await clock.ask(Admit(key, route, SessionSpec(h["instructions"], h["tools"])))
        except CapacityError as exc:
            self._drop_route(route)
            return self._refuse(identity, msg.session, "capacity", str(exc))
        except (ActorStopped, asyncio.TimeoutError, AttributeError) as exc:
            self._drop_route(route)
            return self._refuse(identity, msg.session, "capacity", f"node not ready: {exc!r}")
        route.handle = handle
        # `opened` waits for the model's session start (prompt prefill, talker warm-up: beats on
        # a loaded GPU), so the client streams only once its audio is heard; audio sent before
        # would queue, overflow and be dropped.
        ready = route.ready = clock.when_ready(handle)
        if route.cancelled and not ready.done():
            ready.cancel()
        try:
            await asyncio.wait({ready}, timeout=self.cfg.start_timeout_s)
        finally:
            route.ready = None
        answered = ready.done() and not ready.cancelled()
        refused = ready.exception() if answered else None     # StartRefused: no room for it
        if self.draining or refused or route.cancelled or not (answered and ready.result()):
            await self._free_slot(handle)
            self._drop_route(route)
            if self.draining:
                return self._refuse(identity, msg.session, "draining", "the node is shutting down")
            if route.cancelled:                         # the client closed it while it started
                self.send(identity, P.pack("closed", msg.session, stats=_zero_stats()))
                return None
            if refused:                                 # the device had no room for its start
                return self._refuse(identity, msg.session, "capacity", str(refused))
            if answered:                                # its clock went away mid-start
                return self._refuse(identity, msg.session, "capacity",
                                    "the engine restarted while the session was starting")
            return self._refuse(identity, msg.session, "capacity",
                                f"the model did not finish starting the session within "
                                f"{self.cfg.start_timeout_s:.0f} s (node overloaded)")
        cfg = SessionConfig(msg.session, identity, handle, h["sample_rate"], h["format"],
                            h["output_sample_rate"], h["output_format"],
                            clock.endpoint, self.cfg.idle_timeout_s)
        route.actor = self.supervisor.start_child(ChildSpec(
            f"session:{identity.hex()}:{msg.session}",
            lambda: self._make_session(cfg), Restart.TEMPORARY, self._session_crashed))
        self._sessions_of[identity] = self._sessions_of.get(identity, 0) + 1
        self.counters.opened += 1
        self.metrics.opened.inc()
        self._update_gauges()
        self.send(identity, P.pack("opened", msg.session, frame_ms=80, beat_ms=160,
                                   output_sample_rate=cfg.output_sample_rate,
                                   output_format=cfg.output_format, slot=handle.slot))

    def _drop_route(self, route: _Route) -> None:
        if self.routes.get((route.identity, route.session)) is route:
            del self.routes[(route.identity, route.session)]

    def _make_session(self, cfg: SessionConfig) -> SessionActor:
        return SessionActor(cfg, self.ctx, self.send, self.executor.text_codec,
                            self.executor.user_codec, self.clock, self._close_session,
                            lambda identity: self._last_seen.get(identity, 0.0),
                            self._function_tokens,
                            output_turn=lambda: self.clock_actor.output_turn())

    def _deliver(self, route: _Route, out: BeatOut) -> bool:
        """The clock's route for a session's beat outputs: into its actor's mailbox."""
        if route.actor is None:
            return False
        try:
            route.actor.tell(out, MsgClass.AUDIO)
        except ActorStopped:
            return False
        return True

    def _function_tokens(self, actor: SessionActor, ids: list[int]) -> None:
        self.clock_actor.tell(FunctionTokens(actor.cfg.handle, ids))

    # -- closing ----------------------------------------------------------------------------------
    async def _close_session(self, actor: SessionActor, why: Close) -> None:
        """Runs inside the session actor: free the slot, send `closed`, stop the actor."""
        if actor.closing:
            return
        actor.closing = True
        stats = await self._release(actor)
        self.send(actor.cfg.identity, P.pack("closed", actor.cfg.session, stats=stats))
        self._forget(actor, why.reason)
        asyncio.get_running_loop().create_task(
            self.supervisor.stop_child(f"session:{actor.cfg.identity.hex()}:{actor.cfg.session}"))

    async def _free_slot(self, handle: Handle, stream_ended: bool = False):
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

    async def _release(self, actor: SessionActor) -> dict:
        slot_stats = await self._free_slot(actor.cfg.handle, actor.end_stream())
        actor.flush_input()
        c = actor.counters
        s = slot_stats
        return {"frames_in": s.frames_in if s else 0,
                "frames_out": c.frames_sent,
                "underruns": s.underruns if s else 0,
                "dropped": (s.dropped if s else 0) + actor.input_drops() + c.dropped_out,
                "late_beats": s.late_beats if s else 0}

    def _forget(self, actor: SessionActor, reason: str) -> None:
        key = (actor.cfg.identity, actor.cfg.session)
        route = self.routes.get(key)
        if route is not None and route.actor is actor:
            del self.routes[key]
            left = self._sessions_of.get(actor.cfg.identity, 1) - 1
            if left > 0:
                self._sessions_of[actor.cfg.identity] = left
            else:
                self._sessions_of.pop(actor.cfg.identity, None)
        self.counters.closed += 1
        self.metrics.closed.labels(reason).inc()
        self._update_gauges()

    async def _session_crashed(self, actor: SessionActor, exc: BaseException) -> None:
        self.counters.crashed += 1
        if actor.closing:
            return
        actor.closing = True
        self._error(actor.cfg.identity, P.INTERNAL, f"session failed: {type(exc).__name__}",
                    actor.cfg.session)
        stats = await self._release(actor)
        self.send(actor.cfg.identity, P.pack("closed", actor.cfg.session, stats=stats))
        self._forget(actor, "crash")

    # -- metrics ----------------------------------------------------------------------------------
    def _on_beat(self, rec: BeatRecord) -> None:
        m = self.metrics
        m.beats.inc()
        m.beat_latency.observe(rec.latency_s)
        if rec.late:
            m.late_beats.inc()
        clock = self.clock_actor
        if clock is not None:
            total = clock.table.jitter.totals.underruns
            if total > self._underruns_reported:
                m.underruns.inc(total - self._underruns_reported)
                self._underruns_reported = total

    def _update_gauges(self) -> None:
        live = len(self.sessions)
        self.metrics.sessions.set(live)
        self.metrics.free_slots.set(self.executor.max_sessions - live)

    def status(self) -> dict:
        clock = self.clock_actor
        lat = sorted(clock.stats.recent) if clock else []
        pct = (lambda q: 1000 * lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0)
        totals = clock.table.jitter.totals if clock else None
        return {"sessions": len(self.sessions),
                "beats": clock.stats.beats if clock else 0,
                "p50_ms": pct(0.5), "p99_ms": pct(0.99),
                "late_beats": clock.stats.late_beats if clock else 0,
                "underruns": totals.underruns if totals else 0,
                "dropped": totals.dropped if totals else 0,
                "refusals": sum(self.counters.refusals.values()),
                "errors": sum(self.counters.errors.values())}


if __name__ == "__main__":
    from wave_actors.node_cli import main
    main()
