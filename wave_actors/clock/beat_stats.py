"""What the beat clock keeps of each beat it runs: one `BeatRecord` a beat (its release, its
latency and where the time went) and the `ClockStats` counters over them, which the bench, the
tests and the engine's proxy of the clock read."""
from __future__ import annotations

import collections
from dataclasses import dataclass, field


@dataclass
class BeatRecord:
    beat: int
    release: float
    latency_s: float
    compute_s: float
    sessions: int
    late: bool
    begin_s: float = 0.0     # release → the beat planned (frames read, slot changes applied)
    wake_s: float = 0.0      # release → the beat loop awake: how long the loop was busy elsewhere
    frames_read: int = 0     # audio frames read since the previous beat was released
    gc_s: float = 0.0        # garbage collection since the previous beat (a stopped loop)
    returned_s: float = 0.0  # release → the executor's beat done, back on the loop
    rows: int = 0            # start rows the beat carried
    resets: int = 0          # slots reset for sessions opened
    rolls: int = 0           # sessions whose context rolled after the beat
    # CPU since the previous beat's record: of the loop's thread (everything that competes with
    # the release: the clock, the front, every session actor) and of the whole process (its
    # other threads too: the executor's worker, ZMQ's I/O). Over a beat's wall time, the share
    # of the loop that is busy.
    loop_cpu_s: float = 0.0
    process_cpu_s: float = 0.0
    pack_s: float = 0.0      # the beat planned → packed: host time before the executor's call
    # Of process_cpu_s, the executor's own threads' work that stands in for a device's (the
    # sim's hearing; `Executor.cpu_s`): the rest is the clock's process's own.
    executor_cpu_s: float = 0.0
    # release → the beat's first frame routed: ahead of latency_s when the executor finishes
    # frame 0 early (`caps.first_frame`), else equal to it
    first_s: float = 0.0
    copies: int = 0          # sessions started by a prompt-snapshot copy in the beat


@dataclass
class ClockStats:
    beats: int = 0
    late_beats: int = 0
    dropped_frames: int = 0       # frames pushed for unknown, stale or released sessions
    unroutable: int = 0           # outputs whose owner could not take them (not yet, or gone)
    records: list[BeatRecord] = field(default_factory=list)        # every beat (bench, tests)
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=1000))

    def add(self, rec: "BeatRecord", keep: bool) -> bool:
        """Every beat the executor ran is recorded (with `keep`: its time delays the next); only
        beats that carried sessions count in latency and lateness (a start-only beat has no
        audio waiting on it): whether this one did."""
        if keep:
            self.records.append(rec)
        if rec.sessions == 0:
            return False
        self.beats += 1
        self.late_beats += int(rec.late)
        self.recent.append(rec.latency_s)
        return True
