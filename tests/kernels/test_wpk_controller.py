"""The host's handle on the resident controller (`gpu/wpk/controller.py`) against the
controller and stand-in lanes in the threaded interpreter.

Bugs these catch: maintenance run while the controller is still resident (the body must see it
drained), beats lost or replayed across a pause, a relaunch that starts its run count over;
a watchdog that never fires (a hung beat hangs the node) or fires on a healthy controller; a
failure that is not reported with the controller's error word."""
from __future__ import annotations

import threading

import pytest
import torch

from gpu.wpk import mailbox as M
from gpu.wpk.controller import ControllerFailed, ResidentController
from gpu.wpk.sync import interp
from tests.kernels.wpk_threads import threaded

pytestmark = pytest.mark.skipif(not interp(), reason="the interpreter's threaded runs")

LANES, MAX_RUNS = 2, 16


class _Rig:
    def __init__(self, lanes: bool = True, lane_timeout_ns: int = 10**9):
        self.work = torch.zeros(1, dtype=torch.int32)
        self.args = torch.zeros(1, dtype=torch.int32)
        self.frames = torch.zeros(2, dtype=torch.int32)
        self.out = torch.full((MAX_RUNS, 2, LANES), -1, dtype=torch.int32)
        self.launches, self.threads, self.failures = [], [], []
        self.timeout_ns = lane_timeout_ns
        self.ctl: ResidentController | None = None
        if lanes:
            self._thread(M.lane_grid, (LANES,), self.work, self.args, self.frames, self.out,
                         LANES, MAX_RUNS)

    def _thread(self, kernel, grid, *args):
        def run():
            try:
                threaded(kernel, grid, *args, IS_INTERP=True, timeout_s=120)
            except BaseException as exc:
                self.failures.append(exc)
        t = threading.Thread(target=run)
        t.start()
        self.threads.append(t)

    def launch(self, first_seq, runs):
        self.launches.append((first_seq, runs))
        self._thread(M.controller, (1,), self.ctl.box.block, self.work, self.args, self.frames,
                     LANES, first_seq, runs, self.timeout_ns)

    def join(self):
        for t in self.threads:
            t.join(150)
        assert not any(t.is_alive() for t in self.threads) and not self.failures, self.failures


def _controller(rig: _Rig, **kw) -> ResidentController:
    rig.ctl = ResidentController(rig.launch, **kw)
    return rig.ctl


def _beat(rig, live):
    ctl = rig.ctl
    try:
        ring = ctl.beat(beat=live, live=live, timeout_s=30)
        ctl.box.wait_beat(ring, timeout_s=30)
    except M.MailboxTimeout as exc:
        # a program thread that failed leaves the mailbox unanswered: say why, not only that
        raise AssertionError(f"{exc}; program threads failed with {rig.failures!r}") from exc


def test_maintenance_runs_with_the_controller_drained_and_beats_go_on_after_it():
    rig = _Rig()
    ctl = _controller(rig, watchdog_s=30)
    ctl.start()
    _beat(rig, 3)
    seen = []
    with ctl.paused(timeout_s=30):
        seen.append(ctl.box.state)                 # nothing resident now
        with pytest.raises(RuntimeError, match="paused"):
            ctl.beat(1, 1)
    _beat(rig, 4)
    _beat(rig, 5)
    ctl.stop(timeout_s=30)
    rig.join()
    assert seen == [M.DRAIN]
    assert rig.launches == [(1, 0), (3, 1)]        # relaunched after ring 2 (DRAIN), 1 run done
    for run, live in ((1, 3), (2, 4), (3, 5)):
        assert rig.out[run - 1, 1].tolist() == [live * 100 + 10 + lane for lane in range(LANES)]
    assert (rig.out[3:] == -1).all() and ctl.failed is None


def test_the_watchdog_reports_a_controller_whose_lanes_never_finish():
    rig = _Rig(lanes=False, lane_timeout_ns=200_000)
    failed = []
    ctl = _controller(rig, watchdog_s=60, on_fail=failed.append)
    ctl.start()
    ctl.beat(beat=1, live=1, timeout_s=30)
    rig.threads[-1].join(60)                        # the controller gave up on its lanes
    for _ in range(2000):
        if failed:
            break
        threading.Event().wait(0.01)
    assert failed and f"error ({M.LANE_TIMEOUT}, 1)" in failed[0]
    with pytest.raises(ControllerFailed):
        ctl.beat(beat=2, live=1)
    ctl.stop()
    rig.join()


@pytest.mark.slow
def test_the_watchdog_rings_exit_when_a_beat_is_not_done_in_time():
    # No lanes: the controller waits 5,000 polls for them, the watchdog 50 ms for the beat.
    rig = _Rig(lanes=False, lane_timeout_ns=5_000_000)
    failed = []
    ctl = _controller(rig, watchdog_s=0.05, on_fail=failed.append)
    ctl.start()
    ring = ctl.beat(beat=1, live=1, timeout_s=30)
    for _ in range(2000):
        if failed:
            break
        threading.Event().wait(0.01)
    assert failed and f"ring {ring.seq} not done" in failed[0]
    assert ctl.box.words[M.DOORBELL.value] == ring.seq + 1       # EXIT rung behind it
    ctl.stop()
    rig.join()                                     # the controller ends (its lanes timed out)
