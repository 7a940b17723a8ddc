"""The engine clock's route (`clock/routes.py`): a beat's outputs to the session workers, one
message a worker a beat, and every beat's record to the front.

With `shared`, the executor writes into output buffers the workers map, and a beat's message
to a worker carries its rows' headers only. With `frames`, the workers write their frames into
a ring this clock pulls and packs from, and send nothing; each sender of frames is told once
where that ring lies.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import zmq

from wave_actors.clock.beat_stats import BeatRecord
from wave_actors.clock.clock import BeatClockActor
from wave_actors.clock.shared_frames import SharedFrames
from wave_actors.clock.shared_outputs import SharedOutputs
from wave_actors.clock.view import ClockView
from wave_actors.core.contract import Handle
from wave_actors.core.frames import ALL_FRAMES, FIRST_FRAME
from wave_actors.core.sched.session_table import Routed
from wave_actors.sessions import worker_wire as W


class ToWorkers:
    """Routes by worker, as arrays: each slot's session's worker (an index into `_workers`,
    -1: not bound yet) and the front's number for it; the front binds them (`bind`)."""

    def __init__(self, max_sessions: int, shared: SharedOutputs | None = None,
                 frames: SharedFrames | None = None):
        self._shared, self._frames = shared, frames
        self._shared_name = shared.name.encode() if shared is not None else b""
        if frames is not None:
            frames.clear()
        self.clock: ClockView | None = None
        self._told: set[bytes] = set()         # senders told where the frames' ring lies
        self._owner_worker = np.full(max_sessions, -1, np.int32)
        self._owner_rid = np.zeros(max_sessions, np.int64)
        self._workers: list[bytes] = []            # socket identities, in order first seen
        self._worker_index: dict[bytes, int] = {}
        self._fills: list[int] = []

    def attach(self, clock: ClockView) -> None:
        self.clock = clock

    def outputs(self, executor) -> list:
        if self._shared is None:
            return [executor.alloc_output(), executor.alloc_output()]
        self._shared.clear()
        self._fills = [0] * self._shared.depth
        return [executor.alloc_output(out) for out in self._shared.outputs]

    def refilling(self, index: int) -> None:
        if self._shared is not None:
            self._shared.refilling(index)

    def filled(self, index: int) -> None:
        if self._shared is not None:
            self._fills[index] = self._shared.filled(index)

    def admitted(self, slot: int) -> None:
        self._owner_worker[slot] = -1          # a new session: unbound until the front says

    def greet(self, sender: bytes, force: bool = False) -> None:
        if sender in self._told and not force:
            return
        self._told.add(sender)
        ring = self._frames
        where = (ring.slots, ring.ring, ring.name.encode()) if ring is not None else (0, 0, b"")
        try:
            self.clock.tx.send([sender, *W.frames_at(*where)])
        except zmq.ZMQError:                   # the sender is gone
            pass

    def bind(self, handle: Handle, worker: bytes, rid: int) -> None:
        """Where a current session's outputs go: its worker's socket and the front's number for
        it. Rows of a session not bound yet (or no longer current) are unroutable."""
        entry = self.clock.slots.table.entries.get(handle.slot)
        if entry is None or entry.handle != handle:
            return
        index = self._worker_index.get(worker)
        if index is None:
            index = self._worker_index[worker] = len(self._workers)
            self._workers.append(worker)
        self._owner_worker[handle.slot] = index
        self._owner_rid[handle.slot] = rid

    def send(self, routed: Routed, out, frames: slice | None = None) -> None:
        # Once a beat, as arrays: the routed rows ordered by worker, every field gathered once,
        # then each worker's rows sent as contiguous slices of those arrays, in one message.
        # The PCM stays in the shared output buffer, for each worker to copy its own rows out;
        # without one it is gathered here, in one copy (the buffer is refilled two beats on).
        # A first frame routed early travels in the message: the shared buffer is stamped
        # filled only once the whole beat is.
        if not routed:
            return
        clock = self.clock
        frames = frames or ALL_FRAMES
        n = len(routed)
        workers = self._owner_worker[routed.slots]
        order = np.argsort(workers, kind="stable")
        workers = workers[order]
        unbound = int(np.searchsorted(workers, 0))     # -1 sorts first: rows of no worker
        clock.stats.unroutable += unbound
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
            index = next(i for i, o in enumerate(clock.outputs) if o is out)
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
                clock.tx.send([self._workers[index], *message(a, b)], copy=False)
            except zmq.ZMQError:               # the worker died: its sessions are ending
                clock.stats.unroutable += b - a

    def reporter(self, epoch: int, report: Callable[[tuple], None]) -> Callable[[BeatRecord], None]:
        """Every beat's record to the front, with the clock's totals and the stalls since the
        last report."""
        stalls_sent = [0.0]

        def record(rec: BeatRecord) -> None:
            clock = self.clock
            new = clock.stalls.since(stalls_sent[0])
            if new:
                stalls_sent[0] = max(s.release for s in new) + 1e-9
            t = clock.slots.table.jitter.totals
            report(("beat", epoch, rec,
                    {"underruns": t.underruns, "dropped": t.dropped,
                     "dropped_frames": clock.stats.dropped_frames,
                     "unroutable": clock.stats.unroutable, "free_slots": clock.free_slots,
                     "outputs_shared": self._shared is not None,
                     "frames_shared": self._frames is not None,
                     "frames_read_by_executor": clock.executor_reads,
                     "frames_overwritten": clock.slots.table.jitter.overwritten,
                     "snapshots": clock.snapshot_stats},
                    new))
        return record


def engine_clock(executor, ctx, endpoint: str, clock, policy, start_policy, epoch: int,
                 keep_records: bool, report: Callable[[tuple], None],
                 shared: SharedOutputs | None = None,
                 frames: SharedFrames | None = None) -> BeatClockActor:
    """The engine process's beat clock: alone on its loop, routing to the workers."""
    route = ToWorkers(executor.max_sessions, shared, frames)
    return BeatClockActor(executor, ctx, endpoint, clock, route, policy, start_policy, epoch,
                          keep_records=keep_records, frames_ring=frames, alone=True,
                          on_record=route.reporter(epoch, report))
