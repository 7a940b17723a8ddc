"""The host's handle on a resident controller: start it, ring beats,
pause it around maintenance, and a watchdog that falls back when it stops answering.

- `paused()`: anything that may load a module or synchronise the device (a capture, an eager
  start step, a first launch) must not run while a program is resident (such a
  launch never returns). DRAIN ends the controller after the work already released; the body
  runs; the controller is launched again from the next ring and the run count reached.
- The watchdog (a thread) watches the oldest ring not yet done: when it is not done within
  `watchdog_s`, or the controller reports FAILED, it rings EXIT with plain stores (no CUDA call,
  so it works even while another thread is stuck in the driver) and calls `on_fail` with what
  the error word says; an executor built on this then serves from its graphs again.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable

from gpu.wpk import mailbox as M


class ControllerFailed(RuntimeError):
    pass


class ResidentController:
    def __init__(self, launch: Callable[[int, int], None], box: M.Mailbox | None = None,
                 watchdog_s: float = 0.5, on_fail: Callable[[str], None] | None = None,
                 poll_s: float = 0.001):
        """`launch(first_seq, runs)` starts the controller program (and returns at once)."""
        self.box = box or M.Mailbox()
        self._launch = launch
        self.watchdog_s, self.on_fail, self.poll_s = watchdog_s, on_fail, poll_s
        self.runs = 0                       # RUN rings so far: where a relaunch continues
        self.failed: str | None = None
        self._pending: list[tuple[M.Ring, float]] = []   # rings not seen done, with ring times
        self._lock = threading.RLock()
        self._paused = False
        self._stop = threading.Event()
        self._dog: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self._launch(self.box.seq + 1, self.runs)
        self._dog = threading.Thread(target=self._watch, name="wpk-watchdog", daemon=True)
        self._dog.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """EXIT, once every ring before it is done (unless the controller already failed)."""
        self._stop.set()
        if self._dog is not None:
            self._dog.join(timeout_s)
        if self.failed is None:
            self.box.ring(M.EXIT, timeout_s=timeout_s)
            self.box.wait_state(M.EXIT, timeout_s)

    @contextlib.contextmanager
    def paused(self, timeout_s: float = 5.0):
        """No program resident while the body runs (see the module's docstring)."""
        self._check()
        with self._lock:                    # the watchdog does not judge a drained controller
            self.box.ring(M.DRAIN, timeout_s=timeout_s)
            self.box.wait_state(M.DRAIN, timeout_s)
            self._pending.clear()
            self._paused = True
            try:
                yield
            finally:
                self._paused = False
                first_seq, runs = self.box.relaunch_args(self.runs)
                self._launch(first_seq, runs)

    # -- beats --------------------------------------------------------------------------------
    def beat(self, beat: int, live: int, timeout_s: float = 1.0) -> M.Ring:
        self._check()
        if self._paused:
            raise RuntimeError("a beat rung while the controller is paused for maintenance")
        with self._lock:
            ring = self.box.run(beat, live, timeout_s)
            self.runs += 1
            self._pending.append((ring, time.monotonic()))
        return ring

    def _check(self) -> None:
        if self.failed is not None:
            raise ControllerFailed(self.failed)

    # -- the watchdog -------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.is_set() and self.failed is None:
            time.sleep(self.poll_s)
            with self._lock:
                while self._pending and self.box.beat_done(self._pending[0][0]):
                    self._pending.pop(0)
                why = None
                if self.box.state == M.FAILED:
                    why = f"the controller failed: error {self.box.error()}"
                elif self._pending and time.monotonic() - self._pending[0][1] > self.watchdog_s:
                    ring = self._pending[0][0]
                    why = (f"ring {ring.seq} not done in {self.watchdog_s} s (state "
                           f"{self.box.state}, error {self.box.error()}, heartbeat "
                           f"{self.box.heartbeat()})")
                if why is not None:
                    self._give_up(why)

    def _give_up(self, why: str) -> None:
        self.failed = why
        # Plain stores only: EXIT into the next slot whatever its state, then the doorbell.
        seq = self.box.seq + 1
        at = M.DESC.value + (seq % M.K_SLOTS) * M.LINE
        self.box.words[at:at + 3] = (M.EXIT, 0, 0)
        self.box.words[M.DOORBELL.value] = seq
        self.box.seq = seq
        if self.on_fail is not None:
            self.on_fail(why)
