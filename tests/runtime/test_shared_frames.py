"""The clients' frames in the engine's shared ring (`wave_actors/clock/shared_frames.py`): written by
a worker, found by the clock at its release (`SessionTable.pull_ring`), packed from the ring.

Bugs these catch: a frame the pull misses (a slot's next frame looked for in the wrong place,
or the pull stopping after one frame a slot); a frame queued twice (once from a message, once
from the ring); a slot's previous session's frame heard by its next one (the generation not
checked); a pull that stalls for good once a writer has lapped the ring (a burst of more frames
than the ring holds), or that drops other frames than a full jitter buffer would; a frame written
over between its pull and its pack heard as the newer frame's audio instead of silence, or not
counted (and, when the executor reads the ring itself, the same at its read, charged to the
session packed); a worker's map that is read-only or unlinks the segment when it exits; a batcher that
still sends the samples (or the headers) of frames it wrote into the ring, or loses a session's
end-of-stream marker."""
from __future__ import annotations

import asyncio
import contextlib
import mmap
import multiprocessing as mp

import numpy as np
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from transports import zsock
from wave_actors.core.contract import BeatInput
from wave_actors.core.frames import SAMPLES_IN
from wave_actors.core.sched.session_table import END_OF_STREAM, SessionTable
from wave_actors.clock import frame_batch
from wave_actors.clock.frame_batch import FrameBatcher
from wave_actors.clock.shared_frames import FramesView, SharedFrames, layout, ring_for

MAX_QUEUE = 8
RING = ring_for(MAX_QUEUE)


def _frame(generation: int, number: int) -> np.ndarray:
    """A frame whose samples name its session and number."""
    return np.full(SAMPLES_IN, (generation % 1000) + number / 1e4, np.float32)


@contextlib.contextmanager
def _ring_table(slots: int):
    """A ring of `slots` slots and a session table that pulls from it."""
    shared = SharedFrames(slots=slots, ring=RING)
    try:
        yield shared, SessionTable(slots, prebuffer=1, max_queue=MAX_QUEUE, ring=shared)
    finally:
        shared.close()


def _write(ring, handle, numbers) -> None:
    for n in numbers:
        ring.write(handle.slot, handle.generation, n, _frame(handle.generation, n))


def _write_in_child(name: str, slots: int, ring: int, rows, conn) -> None:
    view = FramesView(name, slots, ring)
    for slot, generation, number in rows:
        view.write(slot, generation, number, _frame(generation, number))
    view.close()
    conn.send("done")


def test_layout_gives_every_array_its_own_pages():
    size, arrays = layout(37, RING)
    spans = sorted((at, at + int(np.prod(shape)) * np.dtype(dtype).itemsize)
                   for at, shape, dtype in arrays.values())
    assert all(at % mmap.PAGESIZE == 0 for at, _ in spans)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start
    assert spans[-1][1] <= size and arrays["pcm"][1] == (1 + 37 * RING, SAMPLES_IN)


def test_frames_another_process_wrote_are_pulled_in_order_and_packed():
    shared = SharedFrames(slots=4, ring=RING)
    try:
        table = SessionTable(4, prebuffer=1, max_queue=MAX_QUEUE, ring=shared)
        a, b = table.admit("a", None), table.admit("b", None)
        rows = [(a.slot, a.generation, n) for n in range(3)] + \
               [(b.slot, b.generation, n) for n in range(2)]
        ctx = mp.get_context("spawn")
        here, there = ctx.Pipe()
        p = ctx.Process(target=_write_in_child, args=(shared.name, 4, RING, rows, there))
        p.start()
        assert here.recv() == "done"
        p.join(30)
        assert table.pull_ring() == 5
        assert table.pull_ring() == 0                   # nothing is pulled twice
        assert table.jitter.queued(a.slot) == [0, 1, 2]
        inp = BeatInput.alloc(4)
        plan = table.pack(inp, [a.slot, b.slot])
        assert plan.frames == {a.slot: (0, 1), b.slot: (0, 1)}
        for handle in (a, b):
            for f in range(2):
                np.testing.assert_array_equal(inp.audio[handle.slot, f],
                                              _frame(handle.generation, f))
        assert table.jitter.overwritten == 0
    finally:
        shared.close()


def test_a_frame_written_over_between_pull_and_pack_is_heard_as_silence_and_counted():
    with _ring_table(2) as (shared, table):
        h = table.admit("a", None)
        _write(shared, h, range(2))
        assert table.pull_ring() == 2
        # The place of frame 1 taken by frame 1 + RING before the beat is packed.
        _write(shared, h, [1 + RING])
        inp = BeatInput.alloc(2)
        table.pack(inp, [h.slot])
        np.testing.assert_array_equal(inp.audio[h.slot, 0], _frame(h.generation, 0))
        assert not inp.audio[h.slot, 1].any()
        assert table.jitter.overwritten == 1
        assert table.jitter.slot_stats(h.slot).dropped == 1


def test_frames_left_in_the_ring_are_read_where_they_lie_and_a_rewritten_one_is_silent():
    """An executor that reads the frames itself (the clock does not gather them) gets what a
    gather would have given; a place written again before it reads it is silence, counted
    once the beat is collected, against the session that was packed."""
    with _ring_table(3) as (shared, table):
        h, other = table.admit("a", None), table.admit("b", None)
        _write(shared, h, range(2))
        _write(shared, other, range(2))
        table.pull_ring()
        inp = BeatInput.alloc(3)
        table.pack(inp, [h.slot, other.slot], gather=False)
        assert not inp.audio.any()                       # nothing was gathered
        _write(shared, h, [1 + RING])                    # before the executor reads
        rows = inp.rows(np.array([h.slot, other.slot, 2]))
        np.testing.assert_array_equal(rows[0, 0], _frame(h.generation, 0))
        assert not rows[0, 1].any() and not rows[2].any()
        np.testing.assert_array_equal(rows[1, 1], _frame(other.generation, 1))
        assert table.jitter.overwritten == 0             # counted at collect, on the loop
        assert table.jitter.count_torn(inp.frames) == 1
        assert table.jitter.overwritten == 1
        assert table.jitter.slot_stats(h.slot).dropped == 1
        assert table.jitter.slot_stats(other.slot).dropped == 0


def test_a_torn_frame_of_a_slot_taken_again_mid_beat_is_not_charged_to_the_new_session():
    with _ring_table(1) as (shared, table):
        old = table.admit("old", None)
        _write(shared, old, range(2))
        table.pull_ring()
        inp = BeatInput.alloc(1)
        table.pack(inp, [old.slot], gather=False)
        table.release(old)
        new = table.admit("new", None)
        _write(shared, new, [0])                         # the new session's first frame
        rows = inp.rows(np.array([old.slot]))
        np.testing.assert_array_equal(rows[0, 1], _frame(old.generation, 1))
        assert not rows[0, 0].any()                      # never the new session's audio
        dropped = table.jitter.totals.dropped
        assert table.jitter.count_torn(inp.frames) == 1
        assert table.jitter.totals.dropped == dropped + 1
        assert table.jitter.slot_stats(new.slot).dropped == 0


def test_a_slots_previous_session_is_never_heard_by_its_next():
    with _ring_table(1) as (shared, table):
        old = table.admit("old", None)
        table.release(old)
        new = table.admit("new", None)
        assert new.slot == old.slot
        _write(shared, old, range(3))            # the old session's writer, still at it
        assert table.pull_ring() == 0
        _write(shared, new, [0])
        assert table.pull_ring() == 1
        assert table.jitter.queued(new.slot) == [0]


def _lockstep(ops) -> None:
    """The same sessions' frames through a table with a ring (written there, pulled at each
    beat) and through one without (pushed with their samples): the same beats, frame for
    frame, and the same counts."""
    shared = SharedFrames(slots=3, ring=RING)
    try:
        ring = SessionTable(3, prebuffer=2, max_queue=MAX_QUEUE, ring=shared)
        plain = SessionTable(3, prebuffer=2, max_queue=MAX_QUEUE)
        live: list = []                          # (ring handle, plain handle, next frame)
        for op, arg in ops:
            if op == "admit" and ring.free_slots:
                live.append([ring.admit(None, None), plain.admit(None, None), 0])
            elif op == "release" and live:
                hr, hp, _ = live.pop(arg % len(live))
                assert ring.release(hr) == plain.release(hp)
            elif op == "frames" and live:
                entry = live[arg % len(live)]
                hr, hp, n = entry
                k = arg // 3 + 1
                numbers = np.arange(n, n + k)
                pcm = np.stack([_frame(hp.generation, m) for m in numbers])
                for m, row in zip(numbers.tolist(), pcm):
                    shared.write(hr.slot, hr.generation, m, row)
                plain.push_batch(np.full(k, hp.slot), np.full(k, hp.generation), numbers, pcm)
                entry[2] = n + k
            elif op == "beat":
                ring.pull_ring()
                slots = [hr.slot for hr, _, _ in live]
                a, b = BeatInput.alloc(3), BeatInput.alloc(3)
                # Gathered by the clock, or left in the ring for the executor to read.
                gather = arg % 2 == 0
                pa, pb = ring.pack(a, slots, gather), plain.pack(b, slots)
                # The ring's frames carry the ring handle's generation, the plain table's its
                # own: both tables number their generations alike.
                if gather:
                    np.testing.assert_array_equal(a.audio, b.audio)
                else:
                    s = np.arange(3)             # unpacked slots hear silence either way
                    np.testing.assert_array_equal(a.rows(s), b.audio)
                    assert not a.frames.torn
                assert pa.frames == pb.frames
                assert ring.jitter.totals == plain.jitter.totals
                np.testing.assert_array_equal(ring.jitter.stats, plain.jitter.stats)
    finally:
        shared.close()


_OPS = st.lists(st.tuples(st.sampled_from(["admit", "release", "frames", "frames", "beat",
                                           "beat"]),
                          st.integers(0, 3 * (RING + 6))), max_size=60)


@settings(max_examples=60, deadline=None)
@given(_OPS)
def test_the_ring_queues_what_messages_would(ops):
    # Bursts up to a few frames past the ring: a lapped ring drops what a full buffer drops.
    _lockstep([("admit", 0), ("admit", 0)] + ops + [("beat", 0)])


def test_a_burst_past_the_ring_drops_what_a_full_buffer_drops():
    _lockstep([("admit", 0), ("frames", 3 * (RING + 5)), ("beat", 0), ("frames", 3 * 2),
               ("beat", 0), ("beat", 0)])


def test_a_batcher_on_a_ring_sends_only_end_of_stream_markers():
    asyncio.run(_batcher_on_a_ring())


async def _batcher_on_a_ring() -> None:
    shared = SharedFrames(slots=2, ring=RING)
    ctx = zmq.Context()
    try:
        rx, tx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        rx.bind("inproc://batcher-ring")
        tx.connect("inproc://batcher-ring")
        batcher = FrameBatcher(zsock.Tx(tx))
        view = FramesView(shared.name, 2, RING)
        batcher.add(1, 7, 0, _frame(7, 0))           # sent with its samples: not told yet
        batcher.use_ring(view)                       # what came before leaves first
        first = rx.recv_multipart()
        assert first[0] == frame_batch.BATCH_TAG
        for n in (1, 2):
            batcher.add(1, 7, n, _frame(7, n))
        assert batcher.end_stream(1, 7)
        await asyncio.sleep(0.01)                    # a due flush would have run
        marker = rx.recv_multipart()
        assert not rx.poll(100)
        assert marker[0] == frame_batch.HEADS_TAG
        head = frame_batch.decode_heads(marker[1])
        assert head.tolist() == [(1, 7, END_OF_STREAM)]
        assert shared.holds(shared.places(np.array([1, 1]), np.array([1, 2])),
                            np.array([7, 7]), np.array([1, 2])).all()
        np.testing.assert_array_equal(shared.pcm[shared.places(np.array([1]), np.array([2]))[0]],
                                      _frame(7, 2))
        view.close()
    finally:
        ctx.destroy(linger=0)
        shared.close()


def test_the_sim_hears_frames_left_in_the_ring_as_it_hears_gathered_ones():
    """The sim executor's hearing (its user transcript) is the same whether the clock gathered
    the frames or left them in the ring, over more slots than it reads at a time."""
    from sim.executor import HEARD_CHUNK, SimExecutor
    from wave_actors.core.contract import ExecutorOptions
    from wave_actors.core.sched.slot_book import BookPlan

    n = HEARD_CHUNK + 40
    shared = SharedFrames(slots=n, ring=RING)
    try:
        tables = [SessionTable(n, prebuffer=1, max_queue=MAX_QUEUE, ring=shared)
                  for _ in range(2)]
        handles = [[t.admit(i, None) for i in range(n)] for t in tables]
        assert [h.generation for h in handles[0]] == [h.generation for h in handles[1]]
        loud = np.random.default_rng(1).random((n, 2)) < 0.5
        for h, row in zip(handles[0], loud):
            for f in range(2):
                shared.write(h.slot, h.generation, f,
                             np.full(SAMPLES_IN, 0.5 if row[f] else 0.001, np.float32))
        users = []
        for table, gather in zip(tables, (True, False)):
            table.pull_ring()
            sim = SimExecutor(ExecutorOptions(max_sessions=n,
                                              cost_model="bench/costmodel_flat100.json"))
            live = list(range(n))
            plan = BookPlan(0, [], live, np.full((n, 2), -1), np.zeros(n, np.int64),
                            np.zeros(n, np.int64), 0, 0, np.zeros(n, np.int64))
            inp, out = sim.alloc_input(), sim.alloc_output()
            table.pack(inp, live, gather)
            assert (inp.frames is None) == gather

            async def beat():                    # the sim's clock is the loop's
                sim.submit(plan, inp, out)
                sim.collect(plan, out)
            asyncio.run(beat())
            sim.close()
            users.append(out.user.copy())
        np.testing.assert_array_equal(users[0], users[1])
        np.testing.assert_array_equal(users[1][:, :, 0] != -1, loud)
    finally:
        shared.close()
