"""The engine's output buffers shared with the workers (`wave_actors/clock/shared_outputs.py`), on a
real POSIX shared-memory segment mapped by a second process.

Bugs these catch: a worker handed rows of a buffer the executor is refilling (a stale fill
number accepted, or the stamp checked only before the copy, so a copy torn by a refill is
delivered); arrays of the layout overlapping (one field's writes landing in another's, or two
registrations with the GPU driver on one page); a worker's map that unlinks the segment when
the worker exits (Python's resource tracker does that to an attached SharedMemory), so the next
worker cannot map it; an executor that ignores the buffers it is handed (`alloc_output(into)`)
and fills its own, so workers read zeros; a worker that delivers rows it read too late, or
does not count them, or dies on a beat whose engine (and segment) is gone."""
from __future__ import annotations

import mmap
import multiprocessing as mp

import numpy as np
import zmq

from sim.executor import SimExecutor
from transports import zsock
from wave_actors.sessions import worker_wire as W
from wave_actors.core.contract import ExecutorOptions
from wave_actors.core.frames import FRAMES_PER_BEAT
from wave_actors.sessions.session_worker import SessionWorker
from wave_actors.clock.shared_outputs import FIELDS, OutputsView, SharedOutputs, layout


def _read_in_child(name: str, slots: int, depth: int, index: int, fill: int, rows, conn):
    view = OutputsView(name, slots, depth)
    conn.send(view.take(index, fill, np.asarray(rows)))
    view.close()


def _take_elsewhere(shared: SharedOutputs, index: int, fill: int, rows: list[int]):
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    p = ctx.Process(target=_read_in_child,
                    args=(shared.name, shared.slots, shared.depth, index, fill, rows, there))
    p.start()
    got = here.recv()
    p.join(30)
    assert p.exitcode == 0
    return got


def test_layout_gives_every_array_its_own_pages():
    size, buffers = layout(37, 2)
    spans = [(0, 8 * 2)]
    for arrays in buffers:
        assert set(arrays) == {name for name, *_ in FIELDS}
        for at, shape, dtype in arrays.values():
            assert at % mmap.PAGESIZE == 0
            spans.append((at, at + int(np.prod(shape)) * np.dtype(dtype).itemsize))
    spans.sort()
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start
    assert spans[-1][1] <= size


def test_another_process_reads_the_rows_of_the_fill_it_was_told():
    shared = SharedOutputs(slots=6)
    try:
        rng = np.random.default_rng(0)
        out = shared.outputs[1]
        shared.refilling(1)
        out.pcm[:] = rng.standard_normal(out.pcm.shape).astype(np.float32)
        fill = shared.filled(1)
        rows = [4, 0, 5]
        got = _take_elsewhere(shared, 1, fill, rows)
        np.testing.assert_array_equal(got, out.pcm[rows])
        # The reader has exited: its map did not take the segment with it.
        again = _take_elsewhere(shared, 1, fill, rows)
        np.testing.assert_array_equal(again, out.pcm[rows])
        # The other buffer never held this fill.
        assert _take_elsewhere(shared, 0, fill, rows) is None
    finally:
        shared.close()


def test_a_refilled_buffer_is_never_read_as_the_old_beat():
    shared = SharedOutputs(slots=4)
    view = OutputsView(shared.name, 4, shared.depth)
    try:
        fill = shared.filled(0)
        assert view.take(0, fill, np.array([1, 2])) is not None
        shared.refilling(0)                       # the executor may write it now
        assert view.take(0, fill, np.array([1, 2])) is None
        newer = shared.filled(0)
        assert newer != fill
        assert view.take(0, fill, np.array([1, 2])) is None     # the next beat's rows
        assert view.take(0, newer, np.array([1, 2])) is not None
        assert view.take(5, newer, np.array([1])) is None       # no such buffer
    finally:
        view.close()
        shared.close()


class _RefilledWhileCopied(np.ndarray):
    """A PCM buffer that the engine starts refilling while a worker copies rows out of it."""
    shared: SharedOutputs
    index: int

    def take(self, *args, **kwargs):
        self.shared.refilling(self.index)
        return np.asarray(self).take(*args, **kwargs)


def test_a_copy_torn_by_a_refill_is_dropped():
    shared = SharedOutputs(slots=4)
    view = OutputsView(shared.name, 4, shared.depth)
    try:
        fill = shared.filled(1)
        torn = view._pcm[1].view(_RefilledWhileCopied)
        torn.shared, torn.index = shared, 1
        view._pcm[1] = torn
        assert view.take(1, fill, np.array([0, 3])) is None
    finally:
        view.close()
        shared.close()


def test_the_sim_fills_the_buffers_it_is_handed():
    shared = SharedOutputs(slots=3)
    view = OutputsView(shared.name, 3, shared.depth)
    try:
        sim = SimExecutor(ExecutorOptions(max_sessions=3,
                                          cost_model="bench/costmodel_flat100.json"))
        own = sim.alloc_output()
        out = sim.alloc_output(shared.outputs[0])
        assert out is shared.outputs[0]
        fill = shared.filled(0)
        got = view.take(0, fill, np.arange(3))
        assert np.abs(got).max() > 0                     # each slot's tone, not zeros
        np.testing.assert_array_equal(got, own.pcm)
    finally:
        view.close()
        shared.close()


def _worker_reading():
    """A session worker whose messages to the front land on a real socket we read."""
    ctx = zmq.Context()
    front = ctx.socket(zmq.PAIR)
    front.bind("inproc://front")
    sock = ctx.socket(zmq.PAIR)
    sock.connect("inproc://front")
    worker = SessionWorker(0, "inproc://front", (None, None))
    worker.tx = zsock.Tx(sock)
    return ctx, front, worker


def _beat_message(shared: SharedOutputs | None, index: int, fill: int, slots: list[int],
                  name: str | None = None):
    head = np.zeros(len(slots), W.BEAT_ROW)
    head["rid"] = np.arange(len(slots))
    head["hi"] = FRAMES_PER_BEAT                  # the whole beat
    where = np.array([(shared.slots if shared else 4, shared.depth if shared else 2, index,
                       fill)], W.SHARED_AT)
    return W.beat_at(head, np.array(slots), where, (name or shared.name).encode())[1:]


def test_a_worker_counts_rows_it_read_too_late_and_tells_the_front():
    shared = SharedOutputs(slots=4)
    ctx, front, worker = _worker_reading()
    try:
        shared.outputs[0].pcm[2] = 0.5
        fill = shared.filled(0)
        rows, pcm = worker._shared_rows(*_beat_message(shared, 0, fill, [2]))
        assert pcm is not None and (pcm == 0.5).all() and worker.stale_rows == 0
        shared.refilling(0)                               # the beat after next took the buffer
        shared.filled(0)
        rows, pcm = worker._shared_rows(*_beat_message(shared, 0, fill, [2, 3]))
        assert pcm is None and worker.stale_rows == 2
        assert W.read_ctrl(front.recv_multipart()[1]) == ("stale", 2)
        # An engine gone with its segment: counted the same, the worker lives on.
        rows, pcm = worker._shared_rows(*_beat_message(None, 0, 1, [1], name="wave-out-gone"))
        assert pcm is None and worker.stale_rows == 3
    finally:
        for view in worker._views.values():
            view.close()
        ctx.destroy(linger=0)
        shared.close()
