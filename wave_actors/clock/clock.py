"""BeatClockActor: one per GPU. It holds the slots' one owner (`slots.py`: the session table
and the slot book), releases a beat every 160 ms on a drift-free schedule, packs two frames
per session in the beat straight into the executor's input ring, hands the executor the
book's plan, and routes each session's outputs to its owner. Frames come in (`frames_in.py`)
over ZMQ (inproc), each naming its session's handle, or lie in a shared ring the session
workers write; outputs go where the clock's route sends them (`routes.py`): the session
actors' mailboxes in the node's process, or the session workers from the engine process
(`engine/to_workers.py`).

Schedule: release_k = t0 + k·160 ms. A beat that overruns delays the next one (frames are
sequential: frame t+1 needs frame t's tokens), but the schedule never shifts, so the overrun
shows as lateness of the following beats instead of being silently absorbed. The clock never
waits for a client: a missing frame is silence plus an underrun (see `jitter`).

One beat is in flight at a time, but the next is packed while it runs: at its release the clock
reads the frames, plans and packs beat k+1 into the other ring slot, and only then waits for
beat k (if it overran) before submitting. A beat packed while its predecessor still ran began
behind schedule, so it is planned with no time for start work.

Slot changes (open, close, tool results) arrive at any time but reach the book only between
beats (`Slots.plan`). A message naming a stale handle is rejected and counted.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import zmq
import zmq.asyncio

from transports import zsock
from wave_actors.core.sched.clock_policy import ClockPolicy
from wave_actors.core.contract import Executor, Handle, SessionSpec
from wave_actors.core.frames import ALL_FRAMES, BEAT_S, FIRST_FRAME, LATER_FRAMES
from wave_actors.core.sched.jitter import SlotStats
from wave_actors.core.prompt import PromptRejected
from wave_actors.core.sched.session_table import CapacityError
from wave_actors.core.sched.slot_book import BookPlan
from wave_actors.core.sched.start_policy import StartPolicy
from wave_actors.core.timebase import Clock, VirtualTimeLoop
from wave_actors.core.tasks import stop_tasks
from wave_actors.clock.beat_stats import BeatRecord, ClockStats
from wave_actors.clock.frame_batch import FrameBatcher
from wave_actors.runtime.gc_pauses import GcPauses, collect_between_beats
from wave_actors.runtime.loop_stalls import StallWatch
from wave_actors.runtime.actors import Actor, Later
from wave_actors.clock.routes import BeatRoute
from wave_actors.clock.frames_in import FramesIn
from wave_actors.clock.releases import Releases
from wave_actors.clock.slots import Slots
from wave_actors.runtime.turns import OutputTurns

LATE_AFTER_S = BEAT_S + 1e-9     # a nanosecond of slack: float rounding is not lateness

log = logging.getLogger("wave.clock")


@dataclass
class Admit:
    key: Any
    owner: Any                # where the session's outputs go (its route's to know)
    spec: SessionSpec


class AdmitFailed(Exception):
    """An admission failed before it held anything (a bug in tokenizing its prompt): its
    opener is told `internal`; the clock carries on."""


@dataclass
class Release:
    handle: Handle
    stream_ended: bool = False   # its session sent END_OF_STREAM: count its frames in flight first


STREAM_END_WAIT_S = 0.5         # a marker lost with a restarting socket cannot hold a release


@dataclass
class FunctionTokens:
    handle: Handle
    ids: list[int]


class BeatClockActor(Actor):
    # answered to the asker (AdmissionRefused is a CapacityError); the clock lives on
    reply_errors = (CapacityError, PromptRejected, AdmitFailed)

    def __init__(self, executor: Executor, ctx: zmq.asyncio.Context, endpoint: str,
                 clock: Clock, route: BeatRoute, policy: ClockPolicy, start_policy: StartPolicy,
                 epoch: int = 0, on_beat: Callable[[BeatRecord], None] | None = None,
                 keep_records: bool = True, frames_ring=None, alone: bool = False,
                 on_record: Callable[[BeatRecord], None] | None = None):
        """`route`: where each beat's outputs go (`routes.py`). `frames_ring`: a
        `shared_frames.FrameRing` the frames lie in (the session workers write them there and
        send none; the clock pulls them at each release). `alone`: the clock has its loop to
        itself (the engine process), so frames are read only outside the hold before a release
        and the release's spin blocks the loop (`Clock.sleep_until(block=True)`) instead of
        yielding to it; in one process with the sessions, tests hold the turns at will.
        `on_beat`: each beat that carried sessions; `on_record`: every beat run."""
        super().__init__("clock")
        self.route, self.epoch, self.start_policy = route, epoch, start_policy
        self.reads_wait_out_hold = self.release_blocks = alone
        self._on_record = on_record
        self.frames_in = FramesIn(self, frames_ring)
        # The executor reads the beat's frames out of the ring itself, while the beat runs.
        self.executor_reads = frames_ring is not None and executor.caps.reads_frames
        self.executor, self.ctx, self.endpoint, self.clock = executor, ctx, endpoint, clock
        self.policy = policy
        self.slots = Slots(executor, epoch, policy, start_policy, frames_ring)
        self.releases = Releases(self._release)      # a mass hang-up, a few a loop turn
        self.stats = ClockStats()
        self._on_beat, self._keep_records = on_beat, keep_records
        self.gc = GcPauses()
        self.stalls = StallWatch()         # started on a real loop only: virtual time never stalls
        self._watching = False
        self._inputs = [executor.alloc_input(), executor.alloc_input()]     # ring of two slots
        route.attach(self)
        self.outputs = route.outputs(executor)
        self._inflight: asyncio.Task | None = None               # the beat the executor runs
        # Pending from a beat's pack until its submit (only apart while the previous beat
        # overran), with the slots it packed: a release of one of them waits for it, so frames
        # counted as heard have reached the executor. A slot being released is packed no more
        # (`_closing`), so the wait ends with the beat already packed.
        self._handed: asyncio.Future | None = None
        self._handed_slots: frozenset[int] = frozenset()
        self._closing: set[int] = set()
        self.sock: zmq.asyncio.Socket | None = None
        self._frames_sock: zmq.asyncio.Socket | None = None
        self.frames: FrameBatcher | None = None      # the sessions' way in, once started
        self._tasks: list[asyncio.Task] = []
        self.t0: float | None = None
        self.turns = OutputTurns(policy.output_slice)
        # The clock's own share of recent beats (latency less the executor's compute): what an
        # executor must leave of a beat's 160 ms (BeatInput.time_left_s).
        self._host_s: collections.deque = collections.deque(maxlen=16)
        self._cpu_mark = (time.thread_time(), time.process_time(),
                          getattr(executor, "cpu_s", 0.0))
        if executor.caps.reports_launch:
            executor.on_launched = self.turns.free

    # -- lifecycle --------------------------------------------------------------------------------
    async def on_start(self) -> None:
        # A new incarnation starts from an empty table and book: the executor forgets every
        # slot's state too, so nothing of a crashed clock's sessions runs on.
        self.executor.reset()
        if self.frames_in.reads_every:
            # Read on a timer only: a plain socket, which the loop does not watch. An asyncio
            # one would wake the loop for every batch that arrives, read or not.
            self.sock = zmq.Socket(self.ctx, zmq.ROUTER)
        else:
            self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.endpoint)
        self.tx = zsock.Tx(self.sock)
        self._frames_sock = self.ctx.socket(zmq.DEALER)
        self._frames_sock.setsockopt(zmq.LINGER, 0)
        self._frames_sock.connect(self.endpoint)
        self.frames = FrameBatcher(zsock.Tx(self._frames_sock))
        self.gc.install()
        loop = asyncio.get_running_loop()
        self._watching = not isinstance(loop, VirtualTimeLoop)
        if self._watching:
            self.stalls.start()
        self._tasks = [loop.create_task(self.frames_in.run(), name="clock-frames"),
                       loop.create_task(self._beat_loop(), name="clock-beats")]
        for task in self._tasks:
            task.add_done_callback(self._task_died)

    def _task_died(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            # Surface a crash of the beat loop as a crash of the actor, for the supervisor.
            log.error("clock task %s died: %r", task.get_name(), task.exception())
            if self.task and not self.task.done():
                self.tell(_Crash(task.exception()))

    async def on_stop(self) -> None:
        self.gc.uninstall()
        self.stalls.stop()
        self.turns.free()                    # no session waits on a stopped clock
        await stop_tasks([*self._tasks, self._inflight])
        try:                                 # a beat cut off mid-run: the executor settles it
            await self.executor.wait()
        except Exception as exc:
            log.warning("the executor's last beat failed as the clock stopped: %r", exc)
        self.slots.forget_waiters()
        self.releases.forget()
        self.frames_in.stop()
        self.frames = None
        if self._frames_sock is not None:
            self._frames_sock.close(0)
        if self.sock is not None:
            self.tx.close(0)                 # its reader leaves the loop first

    # -- control ----------------------------------------------------------------------------------
    async def handle(self, msg: Any) -> Any:
        if isinstance(msg, Admit):
            # Tokenized before a slot is taken: a prompt that does not fit raises PromptRejected
            # to the opener and holds nothing.
            try:
                tokens = self.executor.prompt_tokens(msg.spec)
            except PromptRejected:
                raise
            except Exception as exc:
                # Nothing is held yet: this opener fails, the clock (every other session's
                # beat) lives on.
                log.exception("tokenizing a prompt failed")
                raise AdmitFailed(f"{type(exc).__name__}: {exc}") from exc
            handle = self.slots.admit(msg.key, msg.owner, tokens, msg.spec)
            self.route.admitted(handle.slot)
            return handle
        if isinstance(msg, Release):
            if not self.slots.current(msg.handle):
                return self._release(msg.handle)        # stale: frees nothing, counted
            # Its waits run beside the mailbox: opens and other releases do not queue behind.
            return Later(self._release_after(msg.handle, msg.stream_ended))
        if isinstance(msg, FunctionTokens):
            self.slots.force(msg.handle, msg.ids)
            return None
        if isinstance(msg, _Crash):
            raise msg.exc
        raise TypeError(f"unexpected message {type(msg).__name__}")

    def when_ready(self, handle: Handle) -> asyncio.Future:
        """Resolves (True) once this admitted session's prompt is planned in: the node answers
        `opened` then. False when the session was released first."""
        return self.slots.when_ready(handle)

    async def _release_after(self, handle: Handle, ending: bool) -> SlotStats | None:
        """A release that waits: for the marker after its session's last frame (frames travel
        on the session's socket, the release on the mailbox, so none may arrive after the slot
        is gone), then for a packed beat that holds its slot to be handed to the executor, then
        for its turn among the releases (a mass hang-up runs a few a loop turn)."""
        if ending:
            await asyncio.wait({self.frames_in.stream_end(handle)}, timeout=STREAM_END_WAIT_S)
        slot = handle.slot
        self._closing.add(slot)
        try:
            while self._handed is not None and slot in self._handed_slots:
                await asyncio.shield(self._handed)
            return await self.releases.release(handle)
        finally:
            self._closing.discard(slot)

    def _release(self, handle: Handle) -> SlotStats | None:
        self.frames_in.forget(handle)
        return self.slots.release(handle)

    @property
    def free_slots(self) -> int:
        return self.slots.free

    @property
    def snapshot_stats(self) -> dict | None:
        """The prompt-snapshot index's counts (hits, prefix hits, misses, saves, evictions,
        kept and their bytes) for this incarnation; None where the executor keeps none."""
        index = self.slots.book.snapshots
        return None if index is None else index.describe()

    @property
    def jitter_totals(self) -> SlotStats:
        """Underruns and drops over every session this incarnation admitted."""
        return self.slots.jitter_totals

    # -- the beat ---------------------------------------------------------------------------------
    async def output_turn(self) -> None:
        """Returns when a session's work may run: at once, except from `policy.release_hold_s`
        before a release until that beat's device work is queued (so that work runs beside the
        device's instead of in front of the release), and a few pieces of work a turn of the
        loop (`policy.output_slice`), so the release's timer fires between them. Session actors
        queue their output work in `turns` instead; this is for a client's audio where the
        policy holds inputs."""
        await self.turns.turn()

    async def _beat_loop(self) -> None:
        self.t0 = self.clock.now()
        k = 0
        while True:
            try:
                await self._beat(k)
            finally:
                if self._inflight is None or self._inflight.done():
                    self.turns.free()             # whatever happened, outputs are never held on
            k += 1

    async def _beat(self, k: int) -> None:
        release = self.t0 + k * BEAT_S
        if self._watching:
            self.stalls.expect(release)
        if self.policy.release_hold_s:
            await self.clock.sleep_until(release - self.policy.release_hold_s)
            self.turns.hold()
        await self.clock.sleep_until(release, spin=self.policy.release_spin_s,
                                     block=self.release_blocks)
        wake = self.clock.now() - release
        if self._watching:
            self.stalls.woke()
        # Frames that arrived by now go into this beat. They are read here, synchronously:
        # yielding to the loop instead would first run every ready task (the session actors'
        # output work of the previous beat among them) before the executor is called.
        self.frames_in.drain()
        frames_read = self.frames_in.took()
        inp, out = self._inputs[k % 2], self.outputs[k % 2]
        behind = self._inflight is not None and not self._inflight.done()
        begin = self.clock.now() - release
        inp.time_left_s = 0.0 if behind else (LATE_AFTER_S - begin - max(self._host_s, default=0.0))
        plan = self.slots.plan(inp.time_left_s)
        in_beat = plan.live
        if self._closing:
            for slot in self._closing.intersection(in_beat):
                inp.audio[slot] = 0.0                  # its session is leaving: it hears nothing
            in_beat = [s for s in in_beat if s not in self._closing]
        packed = self.slots.table.pack(inp, in_beat, gather=not self.executor_reads)
        pack_s = self.clock.now() - release - begin
        if behind:
            self._handed_slots = frozenset(in_beat)
            handed = self._handed = asyncio.get_running_loop().create_future()
            try:
                await asyncio.shield(self._inflight)   # the previous beat overran: after it
            finally:
                # Waiters resume only once this coroutine yields, after the submit below.
                self._handed = None
                handed.set_result(None)
        if plan.idle():
            self.slots.table.complete(packed, late=False)
            self.turns.free()
            collect_between_beats(k)
            return
        if not self.executor.caps.reports_launch:
            self.turns.free()
        self.route.refilling(k % 2)
        self.executor.submit(plan, inp, out)
        self._inflight = asyncio.get_running_loop().create_task(
            self._finish(k, release, plan, packed, out, begin, wake, frames_read, pack_s))
        self._inflight.add_done_callback(self._task_died)

    async def _finish(self, k: int, release: float, plan: BookPlan, packed, out,
                      begin: float, wake: float, frames_read: int, pack_s: float) -> None:
        """Beat k's end: wait for the executor, account, route, record. An executor that
        finishes frame 0 early (`caps.first_frame`) has it routed while frame 1 computes."""
        rest = ALL_FRAMES
        first_s = None
        try:
            if self.executor.caps.first_frame:
                await self.executor.wait_first()
                self.route.send(self.slots.table.peek(packed), out, FIRST_FRAME)
                first_s, rest = self.clock.now() - release, LATER_FRAMES
            await self.executor.wait()
            out.compute_s = self.executor.collect(plan, out)
        finally:
            self.turns.free()
        read = self._inputs[k % 2].frames
        if read is not None and read.torn:
            self.slots.table.jitter.count_torn(read)
        self.route.filled(k % 2)
        self.slots.book.observe(plan, out.compute_s)
        returned = self.clock.now() - release
        in_beat = len(packed.slot_idx) > 0
        routed = self.slots.table.complete(packed, late=returned > LATE_AFTER_S and in_beat)
        self.route.send(routed, out, rest)
        latency = self.clock.now() - release
        if in_beat:
            self._host_s.append(max(0.0, latency - begin - out.compute_s))
        cpu = (time.thread_time(), time.process_time(), getattr(self.executor, "cpu_s", 0.0))
        (loop0, proc0, ex0), self._cpu_mark = self._cpu_mark, cpu
        self._record(BeatRecord(packed.beat, release, latency, out.compute_s, len(packed.slot_idx),
                                latency > LATE_AFTER_S and in_beat, begin, wake,
                                frames_read, self.gc.take(), returned, len(plan.rows),
                                len(plan.resets), len(plan.roll), cpu[0] - loop0, cpu[1] - proc0,
                                pack_s, cpu[2] - ex0, latency if first_s is None else first_s,
                                len(plan.copies)))
        collect_between_beats(k)     # a no-op unless serving_process turned the collector off

    def _record(self, rec: BeatRecord) -> None:
        if self.stats.add(rec, self._keep_records) and self._on_beat:
            self._on_beat(rec)
        if self._on_record is not None:
            self._on_record(rec)


@dataclass
class _Crash:
    exc: BaseException
