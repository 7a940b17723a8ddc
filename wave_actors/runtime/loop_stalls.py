"""What the event loop was doing when the beat clock woke late for a release.

A late wake means some piece of work ran on the loop across the release time; by the time the
clock runs, that work is gone and the beat record can only say how late it was. `StallWatch`
finds the culprit: the clock arms it with each release time before it sleeps, and a watcher
thread that finds the clock still asleep `after_s` past the release samples the loop thread's
Python stack every `every_s` until the clock wakes. Each stall keeps its distinct stacks with how
many samples showed each, innermost frame first.

The watcher costs one thread wake a beat while the loop is on time; it takes the GIL only to
sample, and only while the loop is already late. A stall inside C code that holds the GIL is
sampled once the GIL comes back (the stack then still names the Python line that called it, and
`first_sample_s` shows the wait).
"""
from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger("wave.stalls")


@dataclass
class Stall:
    release: float                     # the release time the clock was late for (monotonic)
    late_s: float                      # release → the clock awake
    first_sample_s: float              # release → the first stack sample
    stacks: list[tuple[int, list[str]]] = field(default_factory=list)   # (samples, frames)

    @property
    def samples(self) -> int:
        return sum(n for n, _ in self.stacks)

    def describe(self, frames: int = 6) -> dict:
        return {"late_ms": round(1e3 * self.late_s, 1),
                "first_sample_ms": round(1e3 * self.first_sample_s, 1),
                "samples": self.samples,
                "stacks": [{"samples": n, "frames": f[:frames]} for n, f in self.stacks[:3]]}


def stack_of(frame, depth: int = 12) -> list[str]:
    """`dir/file.py:line function` for up to `depth` frames, innermost first."""
    out = []
    while frame is not None and len(out) < depth:
        code = frame.f_code
        where = os.path.join(*code.co_filename.split(os.sep)[-2:])
        out.append(f"{where}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return out


class StallWatch:
    """Arm with `expect(release)` before the loop sleeps for a release, `woke()` once awake; the
    stalls found are in `stalls` (the most recent `keep`). `start()` from the loop's thread."""

    LOG_AFTER_S = 0.02              # stalls this long are logged (at most one line per LOG_EVERY_S)
    LOG_EVERY_S = 10.0

    def __init__(self, after_s: float = 0.004, every_s: float = 0.001, longest_s: float = 0.5,
                 keep: int = 64):
        self.after_s, self.every_s, self.longest_s = after_s, every_s, longest_s
        self.stalls: collections.deque[Stall] = collections.deque(maxlen=keep)
        self._cond = threading.Condition()
        self._armed: float | None = None        # the release waited for; None once awake
        self._woke_at = 0.0
        self._target: int | None = None         # the loop thread's id
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._logged_at = -float("inf")

    def start(self) -> "StallWatch":
        self._target = threading.get_ident()
        self._stopped = False
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None

    def expect(self, release: float) -> None:
        with self._cond:
            self._armed = release
            self._cond.notify()

    def woke(self) -> None:
        # No lock: one store each, read by the watcher under the GIL; a sample that races the
        # wake belongs to the stall anyway.
        self._woke_at = time.monotonic()
        self._armed = None

    def _watch(self) -> None:
        while True:
            with self._cond:
                while self._armed is None and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                release = self._armed
            time.sleep(max(0.0, release + self.after_s - time.monotonic()))
            if self._armed != release:
                continue                          # on time (or re-armed for a later release)
            self._sample(release)                 # returns once the clock is awake

    def _sample(self, release: float) -> None:
        seen: collections.Counter = collections.Counter()
        first = None
        while self._armed == release and not self._stopped:
            frame = sys._current_frames().get(self._target)
            now = time.monotonic()
            if self._armed != release:
                break
            first = now if first is None else first
            seen[tuple(stack_of(frame))] += 1
            if now - release > self.longest_s:
                break
            time.sleep(self.every_s)
        if first is None:
            return
        while self._armed == release and not self._stopped:    # sampled long enough: wait it out
            time.sleep(self.every_s)
        stall = Stall(release, max(0.0, self._woke_at - release), first - release,
                      [(n, list(s)) for s, n in seen.most_common()])
        self.stalls.append(stall)
        if stall.late_s >= self.LOG_AFTER_S and stall.release - self._logged_at >= self.LOG_EVERY_S:
            self._logged_at = stall.release
            top = stall.stacks[0][1][:3] if stall.stacks else []
            log.warning("the beat clock woke %.1f ms late for a release; the loop was in: %s",
                        1e3 * stall.late_s, " <- ".join(top))

    def since(self, t: float) -> list[Stall]:
        """The stalls for releases at or after `t`."""
        return [s for s in list(self.stalls) if s.release >= t]
