"""The mailbox protocol (`gpu/wpk/mailbox.py`) with its resident controller and stand-in lanes
running in the threaded interpreter, the host's side on this thread.

Bugs these catch: a beat released before its descriptor was read, or twice, or not at all; a
frame or beat reported done before every lane finished it; the ring of descriptors wrapping
onto one the controller has not read (back-pressure); a DRAIN that loses released work, or a
relaunch that starts over (runs counted again from zero, rings replayed); an EXIT that leaves
the work spinning; a lane that never finishes hanging the host instead of setting the error
word within the timeout."""
from __future__ import annotations

import threading

import pytest
import torch

from gpu.wpk import mailbox as M
from gpu.wpk.sync import interp
from tests.kernels.wpk_threads import threaded

pytestmark = pytest.mark.skipif(not interp(), reason="the interpreter's threaded runs")

LANES, MAX_RUNS = 2, 16


class _Device:
    """The device words besides the mailbox, and grids run on threads of their own."""

    def __init__(self):
        self.box = M.Mailbox()
        self.work = torch.zeros(1, dtype=torch.int32)
        self.args = torch.zeros(1, dtype=torch.int32)
        self.frames = torch.zeros(2, dtype=torch.int32)
        self.out = torch.full((MAX_RUNS, 2, LANES), -1, dtype=torch.int32)
        self.grids: list[threading.Thread] = []
        self.failures: list[BaseException] = []

    def _start(self, kernel, grid, *args, timeout_ns=10**9):
        def run():
            try:
                threaded(kernel, grid, *args, timeout_ns, IS_INTERP=True, timeout_s=120)
            except BaseException as exc:
                self.failures.append(exc)
        t = threading.Thread(target=run)
        t.start()
        self.grids.append(t)

    def launch(self, first_seq=1, runs=0, lanes=True, timeout_ns=10**9):
        if lanes:
            self._start(M.controller_and_lanes, (1 + LANES,), self.box.block, self.work,
                        self.args, self.frames, self.out, LANES, MAX_RUNS, first_seq, runs,
                        timeout_ns=timeout_ns)
        else:
            self._start(M.controller, (1,), self.box.block, self.work, self.args, self.frames,
                        LANES, first_seq, runs, timeout_ns=timeout_ns)

    def join(self):
        for t in self.grids:
            t.join(150)
        assert not any(t.is_alive() for t in self.grids)
        assert not self.failures, self.failures

    def beat(self, live):
        ring = self.box.run(beat=live, live=live, timeout_s=30)
        self.box.wait_frame(ring, 0, timeout_s=30)
        self.box.wait_frame(ring, 1, timeout_s=30)
        self.box.wait_beat(ring, timeout_s=30)
        return ring

    def expect(self, run, live):
        want = [[live * 100 + f * 10 + lane for lane in range(LANES)] for f in range(2)]
        assert self.out[run - 1].tolist() == want, (run, self.out[run - 1].tolist())


def test_beats_past_the_ring_are_released_once_and_done_in_order():
    d = _Device()
    d.launch()
    rings = [d.beat(live=3 + i) for i in range(M.K_SLOTS + 3)]      # the ring wraps
    for run, _ring in enumerate(rings, 1):
        d.expect(run, 2 + run)
    assert d.frames.tolist() == [len(rings) * LANES] * 2         # each lane once a frame a run
    d.box.ring(M.EXIT)
    d.box.wait_state(M.EXIT, timeout_s=30)
    d.join()                                                     # the lanes stopped too
    assert d.box.error() is None and d.box.words[M.BEAT_DONE.value] == rings[-1].seq
    stamps = d.box.stamps(rings[-1])
    assert (stamps[:4] >= 0).all() and list(stamps) == sorted(stamps)


def test_rings_wait_while_the_controller_has_not_read_their_slot():
    box = M.Mailbox()                                           # no controller running
    for _ in range(M.K_SLOTS):
        box.run(beat=1, live=1, timeout_s=0.1)
    with pytest.raises(M.MailboxTimeout, match="still unread"):
        box.run(beat=1, live=1, timeout_s=0.2)
    assert box.seq == M.K_SLOTS                                 # nothing was overwritten


def test_a_drained_controller_relaunched_goes_on_from_where_it_left():
    d = _Device()
    d.launch()
    d.beat(live=5)
    d.beat(live=6)
    d.box.ring(M.DRAIN)
    d.box.wait_state(M.DRAIN, timeout_s=30)
    first_seq, runs = d.box.relaunch_args(runs=2)
    d.launch(first_seq, runs, lanes=False)                      # the lanes kept waiting
    d.beat(live=7)
    d.box.ring(M.EXIT)
    d.box.wait_state(M.EXIT, timeout_s=30)
    d.join()
    for run, live in ((1, 5), (2, 6), (3, 7)):
        d.expect(run, live)
    assert (d.out[3:] == -1).all()                              # nothing replayed


def test_a_lane_that_never_finishes_sets_the_error_word_and_ends_the_controller():
    d = _Device()
    d.launch(lanes=False, timeout_ns=200_000)                   # no lanes: frame 0 never done
    ring = d.box.run(beat=1, live=1, timeout_s=30)
    d.box.wait_state(M.FAILED, timeout_s=60)
    d.join()
    assert d.box.error() == (M.LANE_TIMEOUT, ring.seq)
    assert not d.box.frame_done(ring, 0) and not d.box.beat_done(ring)
