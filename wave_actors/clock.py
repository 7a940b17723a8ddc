"""BeatClockActor: one per GPU. Releases a beat every 160 ms on a drift-free schedule, packs two
frames per live session into the backend's (pinned) input slot, runs the backend, stamps latency
and lateness, and hands each session's outputs to its SessionActor's mailbox (`deliver`). Frames
come in over ZMQ (inproc); outputs go straight to the mailbox because the session actors run in
this process and loop: an inproc message per session cost ~25 µs of the loop (3 ms of every
beat's latency at 120 sessions, 7 ms at 300), a mailbox put a few.

Schedule: release_k = t0 + k·160 ms. A beat that overruns delays the next one (frames are
sequential: frame t+1 needs frame t's tokens), but the schedule never shifts, so the overrun
shows as lateness of the following beats instead of being silently absorbed. The clock never
waits for a client: a missing frame is silence plus an underrun (see `scheduler`).

Slot changes (open, close, tool results) arrive at any time but reach the backend only between
beats, so a backend never sees its state change under a running beat.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import zmq
import zmq.asyncio

from transports import zsock
from wave_actors.backend import Backend, SessionSpec, StartRefused
from wave_actors.clocks import Clock
from wave_actors.frames import BEAT_S
from wave_actors.gc_pauses import GcPauses, collect_between_beats

from wave_actors.runtime import Actor
from wave_actors.scheduler import BeatScheduler, CapacityError, SlotStats
from wave_actors.session import END_OF_STREAM, FRAME_HEADER, BeatOut

LATE_AFTER_S = BEAT_S + 1e-9     # a nanosecond of slack: float rounding is not lateness
RELEASE_SPIN_S = 1e-3           # the release's last ms is spun, not timed (Clock.sleep_until)
OUT_HOLD_S = 3e-3               # session actors' output work waits from this long before a
                                # release until the beat's device work is queued

# Hands a session's beat outputs to the SessionActor behind an inproc identity; False when there
# is none (not started yet, or gone).
Deliver = Callable[[bytes, BeatOut], bool]

log = logging.getLogger("wave.clock")


@dataclass
class Admit:
    key: Any
    identity: bytes           # the SessionActor's DEALER identity on the inproc socket
    spec: SessionSpec


@dataclass
class Release:
    slot: int
    stream_ended: bool = False   # its session sent END_OF_STREAM: count its frames in flight first


STREAM_END_WAIT_S = 0.5         # a marker lost with a restarting socket cannot hold a release
_END_HEADER = FRAME_HEADER.pack(END_OF_STREAM)


@dataclass
class FunctionTokens:
    slot: int
    ids: list[int]


@dataclass
class BeatRecord:
    beat: int
    release: float
    latency_s: float
    compute_s: float
    sessions: int
    late: bool
    begin_s: float = 0.0     # release → the backend called (frames packed, ops applied)
    wake_s: float = 0.0      # release → the beat loop awake: how long the loop was busy elsewhere
    frames_read: int = 0     # audio frames read since the previous beat was released
    gc_s: float = 0.0        # garbage collection since the previous beat (a stopped loop)
    returned_s: float = 0.0  # release → the backend's call returned to the beat loop


class RowPool:
    """Reused host buffers for the rows a beat routes. `take` copies rows of `src` into a buffer
    that no session still holds a row of, and returns the filled part. A fresh 1.7 MB array a
    beat (120 sessions' PCM) page-faults as it is first written: 0.5-2.7 ms of the route on the
    2-core CPU, measured. A buffer is free again once every view of it is gone (numpy views keep
    the owning array referenced, so its reference count is back to the pool's own); a session
    that holds its rows for long only makes the pool grow, to `keep` buffers, then allocate."""

    def __init__(self, keep: int = 8):
        self.keep = keep
        self._bufs: list[np.ndarray] = []

    def take(self, src: np.ndarray, rows: list[int]) -> np.ndarray:
        n = len(rows)
        for i in range(len(self._bufs)):
            # references: the list's, `buf` here, getrefcount's argument
            if (buf := self._bufs[i]).shape == src.shape and sys.getrefcount(buf) == 3:
                break
        else:
            buf = np.empty_like(src)
            if len(self._bufs) < self.keep:
                self._bufs.append(buf)
        return np.take(src, rows, axis=0, out=buf[:n], mode="clip")

    @property
    def held(self) -> int:
        """Buffers of the pool some session still holds a row of."""
        return sum(sys.getrefcount(b) > 3 for b in self._bufs)   # list, b, the argument


@dataclass
class ClockStats:
    beats: int = 0
    late_beats: int = 0
    dropped_frames: int = 0       # frames pushed for unknown or released slots
    unroutable: int = 0           # outputs whose session actor was not there (not yet, or gone)
    records: list[BeatRecord] = field(default_factory=list)        # every beat (bench, tests)
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=1000))


class BeatClockActor(Actor):
    reply_errors = (CapacityError,)

    def __init__(self, backend: Backend, ctx: zmq.asyncio.Context, endpoint: str,
                 clock: Clock, deliver: Deliver, prebuffer: int = 3, max_queue: int = 50,
                 on_beat: Callable[[BeatRecord], None] | None = None, keep_records: bool = True):
        super().__init__("clock")
        self.backend, self.ctx, self.endpoint, self.clock = backend, ctx, endpoint, clock
        self._deliver = deliver
        self.scheduler = BeatScheduler(backend.max_sessions, prebuffer, max_queue)
        self.stats = ClockStats()
        self._on_beat, self._keep_records = on_beat, keep_records
        self._frames_read = 0           # since the last release (BeatRecord.frames_read)
        self.gc = GcPauses()
        self._inputs = [backend.alloc_input(), backend.alloc_input()]       # ring of two slots
        self._outputs = [backend.alloc_output(), backend.alloc_output()]
        self._pcm_rows = RowPool()
        self._identity_slot: dict[bytes, int] = {}
        self._slot_identity: dict[int, bytes] = {}
        self._ops: list[tuple] = []              # slot changes for the next beat boundary
        self._backend_open: set[int] = set()
        self._ready_waiters: dict[int, asyncio.Future] = {}   # admitted, start not done yet
        self._stream_ends: dict[int, asyncio.Future] = {}     # END_OF_STREAM seen (closing)
        self._sock: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task] = []
        self.t0: float | None = None
        self._outputs_free = asyncio.Event()
        self._outputs_free.set()
        # The clock's own share of recent beats (latency less the backend's compute): what a
        # backend must leave of a beat's 160 ms (BeatInput.time_left_s).
        self._host_s: collections.deque = collections.deque(maxlen=16)
        if backend.reports_launch:
            backend.on_launched = self._outputs_free.set

    # -- lifecycle --------------------------------------------------------------------------------
    async def on_start(self) -> None:
        self._sock = self.ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(self.endpoint)
        self._tx = zsock.Tx(self._sock)
        self.gc.install()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read_frames(), name="clock-frames"),
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
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._sock is not None:
            self._sock.close(0)

    # -- control ----------------------------------------------------------------------------------
    async def handle(self, msg: Any) -> Any:
        if isinstance(msg, Admit):
            slot = self.scheduler.admit(msg.key)         # raises CapacityError when full
            self._identity_slot[msg.identity] = slot
            self._slot_identity[slot] = msg.identity
            self._ops.append(("open", slot, msg.spec))
            self._ready_waiters[slot] = asyncio.get_running_loop().create_future()
            return slot
        if isinstance(msg, Release):
            if msg.stream_ended and msg.slot in self.scheduler.slots:
                # Frames travel on the session's socket, this message on the mailbox: wait for
                # the marker that follows its last frame, so none arrives after the slot is gone.
                await asyncio.wait({self._stream_end(msg.slot)}, timeout=STREAM_END_WAIT_S)
            return self._release(msg.slot)
        if isinstance(msg, FunctionTokens):
            self._ops.append(("func", msg.slot, msg.ids))
            return None
        if isinstance(msg, _Crash):
            raise msg.exc
        raise TypeError(f"unexpected message {type(msg).__name__}")

    def _stream_end(self, slot: int) -> asyncio.Future:
        fut = self._stream_ends.get(slot)
        if fut is None:
            fut = self._stream_ends[slot] = asyncio.get_running_loop().create_future()
        return fut

    def when_ready(self, slot: int) -> asyncio.Future:
        """Resolves (True) at the first beat that runs this admitted slot's frames: its session
        start (prompt prefill, talker warm-up) is done. The node answers `opened` then."""
        fut = self._ready_waiters.get(slot)
        if fut is None:                                  # already ready (or released)
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(slot in self.scheduler.slots)
        return fut

    def _resolve_ready(self, ready: set[int]) -> None:
        """Waiters of slots now ready get True; those whose start the backend gave up (no room
        on the device) get StartRefused, which the node answers with `refused`."""
        for slot in list(self._ready_waiters):
            why = None if slot in ready else self.backend.start_refused(slot)
            if slot in ready or why:
                fut = self._ready_waiters.pop(slot)
                if fut.done():
                    continue
                if why:
                    fut.set_exception(StartRefused(why))
                else:
                    fut.set_result(True)

    def _release(self, slot: int) -> SlotStats | None:
        self._stream_ends.pop(slot, None)
        fut = self._ready_waiters.pop(slot, None)
        if fut is not None and not fut.done():
            fut.set_result(False)
        if slot not in self.scheduler.slots:
            return None
        stats = self.scheduler.release(slot)
        identity = self._slot_identity.pop(slot, None)
        self._identity_slot.pop(identity, None)
        self._ops.append(("close", slot, None))
        return stats

    @property
    def free_slots(self) -> int:
        return self.scheduler.free_slots

    @property
    def live_sessions(self) -> int:
        return len(self.scheduler.slots)

    def _apply_ops(self) -> None:
        ops, self._ops = self._ops, []
        for kind, slot, arg in ops:
            if kind == "open":
                self.backend.open_slot(slot, arg)
                self._backend_open.add(slot)
            elif kind == "close":
                self.backend.close_slot(slot)
                self._backend_open.discard(slot)
            elif kind == "func" and slot in self._backend_open:
                self.backend.push_function_tokens(slot, arg)

    # -- frames in --------------------------------------------------------------------------------
    async def _read_frames(self) -> None:
        async for batch in zsock.batches(self._sock, self._tx.sync):
            for frames in batch:
                self._frame_in(frames)

    def _drain_frames(self) -> None:
        """Every frame queued on the socket now, without yielding to the loop."""
        sync = self._tx.sync
        while True:
            try:
                self._frame_in(sync.recv_multipart(flags=zmq.NOBLOCK))
            except zmq.Again:
                break
        zsock.kick(self._sock)           # the reads consumed the socket's edge: re-arm its reader

    def _frame_in(self, frames: list) -> None:
        if len(frames) != 3 or len(frames[1]) != FRAME_HEADER.size:   # not a session actor's
            self.stats.dropped_frames += 1
            return
        identity, header, pcm = frames
        slot = self._identity_slot.get(identity)
        if header == _END_HEADER:
            ended = self._stream_end(slot) if slot is not None else None
            if ended is not None and not ended.done():
                ended.set_result(True)
            return
        if slot is None or len(pcm) != 4 * self._inputs[0].audio.shape[-1]:
            self.stats.dropped_frames += 1
            return
        (frame_no,) = FRAME_HEADER.unpack(header)
        self.scheduler.push(slot, frame_no, np.frombuffer(pcm, np.float32))
        self._frames_read += 1

    # -- the beat ---------------------------------------------------------------------------------
    async def output_turn(self) -> None:
        """Session actors await this before a beat's output work (resampling, encoding, sending):
        it returns at once except from OUT_HOLD_S before a release until that beat's device work
        is queued. A beat ends ~10 ms before the next release at 280 dense sessions, and every
        session woken by its outputs then ran in one pass of the loop (~20 ms): the release
        waited for all of it, measured on the H200 host. Held, that work runs beside the GPU's."""
        if not self._outputs_free.is_set():
            await self._outputs_free.wait()

    async def _beat_loop(self) -> None:
        self.t0 = self.clock.now()
        k = 0
        while True:
            try:
                await self._beat(k)
            finally:
                self._outputs_free.set()      # whatever happened, outputs are never held on
            k += 1

    async def _beat(self, k: int) -> None:
        release = self.t0 + k * BEAT_S
        await self.clock.sleep_until(release - OUT_HOLD_S)
        self._outputs_free.clear()
        await self.clock.sleep_until(release, spin=RELEASE_SPIN_S)
        wake = self.clock.now() - release
        # Frames that arrived by now go into this beat. They are read here, synchronously:
        # yielding to the loop instead would first run every ready task, and at 300 sessions
        # the session actors' handling of the previous beat's outputs (~23 ms, measured on
        # the H200 host) then ran before the backend call instead of beside the GPU's work.
        self._drain_frames()
        frames_read, self._frames_read = self._frames_read, 0
        self._apply_ops()
        inp, out = self._inputs[k % 2], self._outputs[k % 2]
        ready = {s for s in self._backend_open if self.backend.ready(s)}
        if self._ready_waiters:
            self._resolve_ready(ready)
        plan = self.scheduler.pack(inp, ready)
        if self._backend_open:               # prefilling slots advance in beats too
            begin = self.clock.now() - release
            inp.time_left_s = LATE_AFTER_S - begin - max(self._host_s, default=0.0)
            if not self.backend.reports_launch:
                self._outputs_free.set()
            await self.backend.run_beat(inp, out)
            returned = self.clock.now() - release
            routed = self.scheduler.complete(plan, late=returned > LATE_AFTER_S and bool(plan.slots))
            self._route(routed, out)
            latency = self.clock.now() - release
            if plan.slots:
                self._host_s.append(max(0.0, latency - begin - out.compute_s))
            self._record(BeatRecord(plan.beat, release, latency, out.compute_s, len(plan.slots),
                                    latency > LATE_AFTER_S and bool(plan.slots), begin, wake,
                                    frames_read, self.gc.take(), returned))
        else:
            self.scheduler.complete(plan, late=False)
        collect_between_beats(k)     # a no-op unless serving_process turned the collector off

    def _route(self, routed: dict, out) -> None:
        # Once a beat, not per session, and only the routed rows: the token rows become lists
        # in one tolist() each, and the PCM rows are copied out in one piece into a reused
        # buffer (the output slot is refilled two beats on; sessions read their rows later).
        rows = list(routed)
        text, func, user = (a[rows].tolist() for a in (out.text, out.func, out.user))
        pcm = self._pcm_rows.take(out.pcm, rows)
        for i, (slot, (_key, first_frame)) in enumerate(routed.items()):
            header = {"frame": first_frame, "text": text[i], "func": func[i], "user": user[i]}
            if not self._deliver(self._slot_identity.get(slot, b""), BeatOut(header, pcm[i])):
                self.stats.unroutable += 1

    def _record(self, rec: BeatRecord) -> None:
        """Every beat the backend ran is recorded (its time delays the next); only beats that
        carried live sessions count in latency and lateness: a prefill-only beat has no audio
        waiting on it."""
        if self._keep_records:
            self.stats.records.append(rec)
        if rec.sessions == 0:
            return
        self.stats.beats += 1
        self.stats.late_beats += int(rec.late)
        self.stats.recent.append(rec.latency_s)
        if self._on_beat:
            self._on_beat(rec)


@dataclass
class _Crash:
    exc: BaseException
