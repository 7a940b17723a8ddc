"""A small asyncio actor runtime: bounded mailboxes with a policy per message class, tell/ask,
and a one_for_one supervisor with restart intensity.

Mailbox policy: one ordered queue holds both classes. AUDIO messages are bounded: when the audio
count reaches its cap the oldest queued AUDIO message is dropped and counted (fresh audio beats
stale audio in a live call). CONTROL messages are never dropped; past `control_cap` a tell fails
loudly with `MailboxFull` so the sender can answer its peer instead of losing the message.
"""
from __future__ import annotations

import asyncio
import collections
import enum
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from wave_actors.core.tasks import within

log = logging.getLogger("wave.runtime")


class MsgClass(enum.Enum):
    AUDIO = "audio"
    CONTROL = "control"


class MailboxFull(Exception):
    pass


class ActorStopped(Exception):
    pass


@dataclass
class Envelope:
    msg: Any
    cls: MsgClass
    reply: asyncio.Future | None = None


@dataclass
class MailboxStats:
    queued: int = 0
    audio_queued: int = 0
    dropped_audio: int = 0
    delivered: int = 0


class Mailbox:
    """Ordered, bounded per class. Invariant: audio_queued <= audio_cap, len <= audio + control cap."""

    def __init__(self, audio_cap: int = 64, control_cap: int = 1024):
        self.audio_cap, self.control_cap = audio_cap, control_cap
        self._q: collections.deque[Envelope] = collections.deque()
        self._audio = 0
        self._ready = asyncio.Event()
        self.dropped_audio = 0
        self.delivered = 0
        self.on_drop: Callable[[Any], None] | None = None

    def __len__(self) -> int:
        return len(self._q)

    def put(self, env: Envelope) -> None:
        if env.cls is MsgClass.AUDIO:
            if self._audio >= self.audio_cap:
                self._drop_oldest_audio()
            self._audio += 1
        elif len(self._q) - self._audio >= self.control_cap:
            raise MailboxFull(f"control mailbox full ({self.control_cap})")
        self._q.append(env)
        self._ready.set()

    def _drop_oldest_audio(self) -> None:
        for i, env in enumerate(self._q):
            if env.cls is MsgClass.AUDIO:
                del self._q[i]
                self._audio -= 1
                self.dropped_audio += 1
                if self.on_drop:
                    self.on_drop(env.msg)
                return

    async def get(self) -> Envelope:
        while not self._q:
            self._ready.clear()
            await self._ready.wait()
        env = self._q.popleft()
        if env.cls is MsgClass.AUDIO:
            self._audio -= 1
        self.delivered += 1
        return env

    def drain(self) -> list[Envelope]:
        items, self._q, self._audio = list(self._q), collections.deque(), 0
        return items

    def stats(self) -> MailboxStats:
        return MailboxStats(len(self._q), self._audio, self.dropped_audio, self.delivered)


@dataclass
class Later:
    """What `handle` returns for an answer that must wait (a release waiting for its session's
    last frames): the actor goes on with the next message while `work` runs, and the asker gets
    its result when it ends. Control messages so never queue behind a slow one's wait."""
    work: Awaitable[Any]


class Actor:
    """Override `handle(msg)`; optionally `on_start`/`on_stop`. One message at a time, in order
    (a handler that returns `Later` has its answer settled on the side)."""

    audio_cap = 64
    control_cap = 1024
    # Exceptions that answer an `ask` (a refusal, not a fault): passed to the asker, no crash.
    reply_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, name: str):
        self.name = name
        self.mailbox = Mailbox(self.audio_cap, self.control_cap)
        self._task: asyncio.Task | None = None
        self.stopped = asyncio.Event()
        self._later: set[asyncio.Task] = set()     # answers being settled on the side

    # -- messaging ------------------------------------------------------------------------------
    def tell(self, msg: Any, cls: MsgClass = MsgClass.CONTROL) -> None:
        if self.stopped.is_set():
            raise ActorStopped(self.name)
        self.mailbox.put(Envelope(msg, cls))

    async def ask(self, msg: Any, timeout: float = 5.0) -> Any:
        if self.stopped.is_set():
            raise ActorStopped(self.name)
        fut = asyncio.get_running_loop().create_future()
        self.mailbox.put(Envelope(msg, MsgClass.CONTROL, fut))
        return await within(fut, timeout)

    # -- lifecycle --------------------------------------------------------------------------------
    async def on_start(self) -> None:
        pass

    async def on_stop(self) -> None:
        pass

    async def handle(self, msg: Any) -> Any:
        raise NotImplementedError

    def start(self) -> asyncio.Task:
        self.stopped.clear()
        task = self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task) -> None:
        # An ended task's exception (a stop's CancelledError too) holds a traceback whose
        # frames hold this actor: kept here it would make a cycle, and the automatic collector
        # is off while serving (`serving_process`), so every closed session's actor, mailbox
        # and buffers would wait for the next full collection. Dropped, they go at once.
        if self._task is task:
            self._task = None

    async def stop(self) -> None:
        if self._task and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def task(self) -> asyncio.Task | None:
        return self._task

    def _settle(self, task: asyncio.Task, env: "Envelope") -> None:
        self._later.discard(task)
        reply = env.reply
        if task.cancelled():
            if reply and not reply.done():
                reply.set_exception(ActorStopped(self.name))
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, self.reply_errors):
            log.error("%s: a deferred answer failed: %r", self.name, exc)
        if reply is None or reply.done():
            return
        if exc is not None:
            reply.set_exception(exc)
        else:
            reply.set_result(task.result())

    async def _run(self) -> None:
        try:
            await self.on_start()
            while True:
                env = await self.mailbox.get()
                try:
                    result = await self.handle(env.msg)
                except self.reply_errors as exc:
                    if env.reply and not env.reply.done():
                        env.reply.set_exception(exc)
                    continue
                except Exception as exc:
                    if env.reply and not env.reply.done():
                        env.reply.set_exception(exc)
                    raise
                if isinstance(result, Later):
                    task = asyncio.get_running_loop().create_task(result.work)
                    self._later.add(task)
                    task.add_done_callback(lambda t, e=env: self._settle(t, e))
                    continue
                if env.reply and not env.reply.done():
                    env.reply.set_result(result)
        finally:
            self.stopped.set()
            for task in list(self._later):
                task.cancel()                  # their askers hear ActorStopped
            for env in self.mailbox.drain():
                if env.reply and not env.reply.done():
                    env.reply.set_exception(ActorStopped(self.name))
            try:
                await asyncio.shield(self.on_stop())
            except Exception:
                log.exception("%s: on_stop failed", self.name)


class Restart(enum.Enum):
    PERMANENT = "permanent"     # always restarted after a crash
    TEMPORARY = "temporary"     # never restarted; `on_crash` cleans up (a live call cannot resume)


@dataclass
class ChildSpec:
    name: str
    factory: Callable[[], Actor]
    restart: Restart = Restart.PERMANENT
    on_crash: Callable[[Actor, BaseException], Awaitable[None] | None] | None = None


@dataclass
class _Child:
    spec: ChildSpec
    actor: Actor
    watcher: asyncio.Task | None = None

    def forget_watcher(self, task: asyncio.Task) -> None:
        """An ended watcher is dropped (as `Actor._ended` drops its task: no cycle)."""
        if self.watcher is task:
            self.watcher = None


class EscalationError(Exception):
    """Restart intensity exceeded: the supervisor gives up and its owner must stop."""


class Supervisor:
    """one_for_one: a crashed child is handled alone; siblings are never touched. More than
    `max_restarts` restarts within `window_s` escalates (sets `failed`)."""

    def __init__(self, max_restarts: int = 5, window_s: float = 10.0,
                 now: Callable[[], float] | None = None):
        self.max_restarts, self.window_s = max_restarts, window_s
        self._now = now or (lambda: asyncio.get_running_loop().time())
        self._children: dict[str, _Child] = {}
        self._restarts: collections.deque[float] = collections.deque()
        self.crashes = 0
        self.restarts = 0
        self.failed = asyncio.Event()
        self.failure: BaseException | None = None
        self._stopping = False

    def start_child(self, spec: ChildSpec) -> Actor:
        if spec.name in self._children:
            raise ValueError(f"child {spec.name} already running")
        actor = spec.factory()
        child = _Child(spec, actor)
        self._children[spec.name] = child
        task = actor.start()
        child.watcher = asyncio.get_running_loop().create_task(self._watch(child, task))
        child.watcher.add_done_callback(lambda t, c=child: c.forget_watcher(t))
        return actor

    def get(self, name: str) -> Actor | None:
        child = self._children.get(name)
        return child.actor if child else None

    async def stop_child(self, name: str) -> None:
        child = self._children.pop(name, None)
        if child is None:
            return
        if child.watcher:
            child.watcher.cancel()
        await child.actor.stop()

    async def stop_all(self) -> None:
        self._stopping = True
        for name in list(self._children):
            await self.stop_child(name)

    async def _watch(self, child: _Child, task: asyncio.Task) -> None:
        try:
            await asyncio.shield(task)
            return          # clean exit
        except asyncio.CancelledError:
            if task.cancelled():
                return      # stopped on purpose
            raise
        except Exception as exc:
            await self._crashed(child, exc)

    async def _crashed(self, child: _Child, exc: BaseException) -> None:
        self.crashes += 1
        log.warning("actor %s crashed: %r", child.spec.name, exc)
        if child.spec.on_crash:
            try:
                res = child.spec.on_crash(child.actor, exc)
                if asyncio.iscoroutine(res):
                    await res
            except Exception:
                log.exception("on_crash of %s failed", child.spec.name)
        if self._stopping or child.spec.restart is Restart.TEMPORARY:
            self._children.pop(child.spec.name, None)
            return
        now = self._now()
        self._restarts.append(now)
        while self._restarts and now - self._restarts[0] > self.window_s:
            self._restarts.popleft()
        if len(self._restarts) > self.max_restarts:
            self.failure = EscalationError(
                f"{child.spec.name}: more than {self.max_restarts} restarts in {self.window_s}s")
            self._children.pop(child.spec.name, None)
            self.failed.set()
            return
        self.restarts += 1
        self._children.pop(child.spec.name, None)
        self.start_child(child.spec)
