"""What the clock's parts read of the clock that holds them: its frame reader (`frames_in.py`)
and its routes (`routes.py`, `engine/to_workers.py`). They are handed the clock as this view,
so a part depends on what it reads, not on the clock's module.
"""
from __future__ import annotations

from typing import Any, Protocol

import zmq

from transports import zsock
from wave_actors.clock.beat_stats import ClockStats
from wave_actors.clock.frame_batch import FrameBatcher
from wave_actors.clock.slots import Slots
from wave_actors.core.sched.clock_policy import ClockPolicy
from wave_actors.core.timebase import Clock
from wave_actors.runtime.loop_stalls import StallWatch
from wave_actors.runtime.turns import OutputTurns


class ClockView(Protocol):
    clock: Clock                      # the time base the beats are released on
    policy: ClockPolicy
    slots: Slots                      # the slots' one owner: the session table and the book
    stats: ClockStats
    turns: OutputTurns
    stalls: StallWatch
    route: Any                        # the clock's `BeatRoute`
    sock: zmq.Socket | None           # the ROUTER frames arrive on, once started
    tx: zsock.Tx                      # sends on `sock`
    frames: FrameBatcher | None       # the in-process sessions' way in, once started
    outputs: list                     # the two output buffers, beat k's in k % 2
    t0: float | None                  # the first release
    reads_wait_out_hold: bool         # frames are not read between a release's hold and its beat
    executor_reads: bool              # the executor reads the beat's frames from the shared ring

    @property
    def free_slots(self) -> int: ...
