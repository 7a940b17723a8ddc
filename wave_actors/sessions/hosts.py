"""Where a node's sessions run: `LocalHost` in the node's own process (a SessionActor per
session under the node's supervisor), `WorkerHost` in session workers (`--workers N`, a
`RemoteSession` per session). Both are a `SessionHost`: the node opens, closes and talks to
its sessions through one, and never asks which kind runs them.

A hosted session takes the same messages either way (`tell` of audio, a close, a function
result) and answers the same questions (`closing`, `cfg`, `expected_seq`, `out_seq`,
`count_flooded`). What a host reports back goes to the node's `HostEvents`: frames for a
session's client, a session that asks to close or failed, function-result tokens for the
clock. A route is the node's own record of a session: a host only hands it back.

Closing is the same three steps on both: `end_stream` (audio queued before the close is taken,
waiting outputs are sent, the frames' end is marked to the clock), then the node frees the
slot at the clock, then `input_drops` (what was lost on the session's side of the clock) and
`forget`.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

import zmq.asyncio

from wave_actors.core.sched.clock_policy import ClockPolicy
from wave_actors.core.contract import Handle
from wave_actors.core.timebase import Clock
from wave_actors.runtime.actors import ActorStopped, ChildSpec, MsgClass, Restart, Supervisor
from wave_actors.runtime.proc_cpu import cpu_seconds
from wave_actors.sessions.messages import Close, SessionConfig
from wave_actors.sessions.session import SessionActor
from wave_actors.sessions.session_worker import frames_wait_s
from wave_actors.sessions.worker_pool import PoolHandlers, RemoteSession, WorkerPool


@dataclass
class HostEvents:
    """The node's side of a host: what the host reports, each about a route it was given."""
    send: Callable[[Any, list, bool], bool]             # route, frames, droppable: sent?
    finish: Callable[[Any, Any, str], Awaitable[None]]  # route, session, why: close it
    failed: Callable[[Any, Any, str], Awaitable[None]]  # route, session, message: it broke
    tokens: Callable[[Handle, list[int]], None]         # function-result tokens for the clock
    stale_rows: Callable[[int], None]                   # beat rows a worker read too late
    spawn: Callable[[Awaitable], None]                  # run a report's work as a task


class HostedSession(Protocol):
    """What the node holds for a session, whichever host runs it."""
    cfg: SessionConfig
    closing: bool

    def tell(self, msg: Any, cls: MsgClass = MsgClass.CONTROL) -> None: ...

    def count_flooded(self, payload: bytes, seq: int | None = None) -> None: ...

    @property
    def expected_seq(self) -> int: ...

    @property
    def out_seq(self) -> int: ...


class SessionHost(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def clock_base(self, default: str) -> str:
        """Where its sessions' frames reach the clock."""

    def open(self, cfg: SessionConfig, route: Any) -> HostedSession:
        """A new session (raises ActorStopped when it cannot be hosted now)."""

    def bind(self, clock: Any, session: Any) -> None:
        """Tell the clock where the session's beat outputs go."""

    async def end_stream(self, session: Any) -> bool:
        """Whether the session's end-of-stream marker reached the clock's side."""

    async def input_drops(self, session: Any, ended: bool) -> int: ...

    def sent(self, session: Any) -> tuple[int, int]:
        """Audio messages its client took, and could not take."""

    def forget(self, route: Any, session: Any) -> None: ...

    def cpu_seconds(self) -> list:
        """CPU seconds of the processes it runs sessions in (none: the node's own)."""


class LocalHost:
    """Sessions as actors in the node's process, under its supervisor."""

    def __init__(self, supervisor: Supervisor, clock_actor: Callable[[], Any],
                 codecs: Callable[[], tuple], clock: Clock, policy: ClockPolicy,
                 events: HostEvents):
        self.supervisor, self.clock_actor, self.codecs = supervisor, clock_actor, codecs
        self.clock, self.policy, self.events = clock, policy, events

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None           # its actors stop with the supervisor

    def clock_base(self, default: str) -> str:
        return default

    def open(self, cfg: SessionConfig, route: Any) -> SessionActor:
        name = route.child                      # its actor's name, stable across resumes
        return self.supervisor.start_child(ChildSpec(
            name, lambda: self._make(cfg, route, name), Restart.TEMPORARY,
            lambda actor, exc: self.events.failed(route, actor,
                                                  f"session failed: {type(exc).__name__}")))

    def _make(self, cfg: SessionConfig, route: Any, name: str) -> SessionActor:
        clock = self.clock_actor()
        return SessionActor(cfg, lambda: clock.frames,
                            lambda frames, droppable=False: self.events.send(route, frames,
                                                                             droppable),
                            *self.codecs(), self.clock,
                            lambda actor, why: self._closed(route, actor, why, name),
                            lambda actor, ids: self.events.tokens(actor.cfg.handle, ids),
                            run_output=lambda work: self.clock_actor().turns.run(work),
                            input_turn=(lambda: self.clock_actor().output_turn())
                            if self.policy.hold_inputs else None)

    async def _closed(self, route: Any, actor: SessionActor, why: Close, name: str) -> None:
        """Runs inside the session's actor: close it, then stop the actor."""
        if actor.closing:
            return
        actor.closing = True
        await self.events.finish(route, actor, why.reason)
        asyncio.get_running_loop().create_task(self.supervisor.stop_child(name))

    def bind(self, clock: Any, session: SessionActor) -> None:
        return None           # the clock hands its outputs to the actor's mailbox

    async def end_stream(self, session: SessionActor) -> bool:
        session.take_queued_audio()
        session.flush_outputs()
        return session.end_stream()

    async def input_drops(self, session: SessionActor, ended: bool) -> int:
        session.flush_input()
        return session.input_drops()

    def sent(self, session: SessionActor) -> tuple[int, int]:
        return session.counters.frames_sent, session.counters.dropped_out

    def forget(self, route: Any, session: SessionActor) -> None:
        # Its actor stops as it closes. The actor's callbacks hold the route: the route lets go
        # of the actor, or the two would wait in a cycle for the next full collection.
        route.actor = None

    def cpu_seconds(self) -> list:
        return []


class WorkerHost:
    """Sessions in N worker processes (`worker_pool.py`), each a `RemoteSession` here."""

    def __init__(self, n: int, ctx: zmq.asyncio.Context, codecs: Callable[[], tuple],
                 policy: ClockPolicy, events: HostEvents):
        self.n, self.ctx, self.codecs, self.policy, self.events = n, ctx, codecs, policy, events
        self.pool: WorkerPool | None = None     # from `start` (the codecs are the engine's)
        self._routes: dict[int, Any] = {}      # a worker's session number → its route

    async def start(self) -> None:
        self.pool = WorkerPool(self.n, self.ctx, self.codecs(),
                               PoolHandlers(self._sends, self._closing, self._crashed,
                                            self._tokens, self._lost, self.events.stale_rows),
                               frames_wait_s=frames_wait_s(self.policy))
        await self.pool.start()

    async def stop(self) -> None:
        if self.pool is not None:
            await self.pool.stop()

    def clock_base(self, default: str) -> str:
        return f"ipc://{self.pool.dir}/clock"      # where the workers' frames reach it

    def open(self, cfg: SessionConfig, route: Any) -> RemoteSession:
        session = self.pool.open(cfg)
        self._routes[session.rid] = route
        return session

    def bind(self, clock: Any, session: RemoteSession) -> None:
        try:
            clock.bind(session.cfg.handle, session.worker.clock_identity, session.rid)
        except ActorStopped:        # the engine is restarting: the session ends with it
            pass

    async def end_stream(self, session: RemoteSession) -> bool:
        try:
            return await session.finish()
        except (ActorStopped, asyncio.TimeoutError):
            return False

    async def input_drops(self, session: RemoteSession, ended: bool) -> int:
        """A worker that died lost what its session still held (audio short of a frame,
        outputs not yet sent): its input frames the clock never counted are unknown, so the
        clock's count stands alone."""
        if not ended:
            return 0
        try:
            return await session.drops()
        except (ActorStopped, asyncio.TimeoutError):
            return 0

    def sent(self, session: RemoteSession) -> tuple[int, int]:
        return session.frames_sent, session.dropped_out

    def forget(self, route: Any, session: RemoteSession) -> None:
        self.pool.forget(session.rid)
        self._routes.pop(session.rid, None)

    def cpu_seconds(self) -> list:
        return [] if self.pool is None else [cpu_seconds(w.proc.pid)
                                             for w in self.pool.workers.values()]

    # -- the pool's reports ---------------------------------------------------------------------
    def _sends(self, rid: int, audio: bool, frames: list) -> None:
        route = self._routes.get(rid)
        if route is None:
            return
        ok = self.events.send(route, frames, audio)
        if audio:
            route.actor.sent(ok)

    def _closing(self, rid: int, reason: str) -> None:
        route = self._routes.get(rid)
        if route is not None and not route.actor.closing:
            route.actor.closing = True
            self.events.spawn(self.events.finish(route, route.actor, reason))

    def _crashed(self, rid: int, name: str) -> None:
        route = self._routes.get(rid)
        if route is not None:
            self.events.spawn(self.events.failed(route, route.actor, f"session failed: {name}"))

    def _tokens(self, rid: int, ids: list[int]) -> None:
        route = self._routes.get(rid)
        if route is not None:
            self.events.tokens(route.actor.cfg.handle, ids)

    def _lost(self, rids: list[int]) -> None:
        """A worker died: each of its sessions fails (its slot freed through its handle, so
        nothing of it reaches the next session there)."""
        for rid in rids:
            route = self._routes.get(rid)
            if route is not None:
                self.events.spawn(self.events.failed(
                    route, route.actor, "the process serving this session failed"))


def make_host(workers: int, supervisor: Supervisor, clock_actor: Callable[[], Any],
              ctx: zmq.asyncio.Context, codecs: Callable[[], tuple], clock: Clock,
              policy: ClockPolicy, events: HostEvents) -> SessionHost:
    """In the node's process (workers = 0) or in that many worker processes; `codecs` gives
    the executor's (text, user) codecs once it runs."""
    if workers > 0:
        return WorkerHost(workers, ctx, codecs, policy, events)
    return LocalHost(supervisor, clock_actor, codecs, clock, policy, events)
