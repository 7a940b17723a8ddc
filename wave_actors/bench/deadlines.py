"""Deadline metrics: what the beats' timing meant to each call.

Input is two plain lists, the same from a full emulation and from the fast mode:
  - call records (`CallRecord`): when the call first dialled, when it was opened (or that it
    was blocked: refused on every try), when it ended, and its refusals;
  - beats: (release time, latency, late) for every beat of the run with a live session, from
    the first open to the last close: not a measured window of them, or a call's late beats
    outside the window would go unheard (`summarize` says how many beats it matched).

A call hears a late beat as a glitch (160 ms of audio that came after its deadline); a run of
consecutive late beats is one longer, audible gap. From these:
  - per call: late beats while it was live, and its longest run of consecutive late beats;
  - glitch-seconds per call-hour, on-time session-seconds;
  - time to `opened` as a distribution;
  - blocking probability (calls refused on every try over calls offered), against the load
    offered in Erlangs.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from wave_actors.core.frames import BEAT_S


@dataclass
class CallRecord:
    call: int                       # index of the call in its workload (or its caller line)
    # Seconds from the run's start: a workload call's first dial; a closed-loop line's call,
    # the dial that opened it (the line redials a refusal after the bench's own pause).
    asked_s: float
    opened_s: float | None = None   # when `opened` came (None: blocked)
    ended_s: float | None = None    # when the call closed (None: still live at the run's end)
    tries: int = 0                  # opens sent, redials included
    refused: list[str] = field(default_factory=list)    # each refusal's reason
    # filled by `per_call`:
    late_beats: int = 0
    longest_late_run: int = 0
    live_beats: int = 0

    @property
    def blocked(self) -> bool:
        return self.opened_s is None

    @property
    def wait_s(self) -> float | None:
        """`asked_s` to `opened`: a workload call's redials included, as its caller waited."""
        return None if self.opened_s is None else self.opened_s - self.asked_s


def _longest_run(late: np.ndarray) -> int:
    if not late.any():
        return 0
    edges = np.diff(np.concatenate([[0], late.astype(np.int8), [0]]))
    return int((np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)).max())


def per_call(calls: list[CallRecord], releases: np.ndarray, late: np.ndarray,
             run_end_s: float) -> None:
    """Each opened call's beats: those released while it was live, [opened, ended), its whole
    life (as far as `releases` reach: give them all)."""
    for c in calls:
        if c.opened_s is None:
            continue
        end = run_end_s if c.ended_s is None else c.ended_s
        a, b = np.searchsorted(releases, [c.opened_s, end])
        mine = late[a:b]
        c.live_beats = int(b - a)
        c.late_beats = int(mine.sum())
        c.longest_late_run = _longest_run(mine)


def _spread(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    p50, p90, p99, top = np.percentile(np.asarray(xs) * 1e3, [50, 90, 99, 100])
    return {"n": len(xs), "p50_ms": round(float(p50), 1), "p90_ms": round(float(p90), 1),
            "p99_ms": round(float(p99), 1), "max_ms": round(float(top), 1)}


def summarize(calls: list[CallRecord], beats: list[tuple[float, float, bool]],
              offered_erlangs: float | None = None, run_end_s: float | None = None) -> dict:
    """The run's deadline metrics (and each call's, filled into `calls`)."""
    order = sorted(beats)
    releases = np.array([b[0] for b in order], np.float64)
    late = np.array([b[2] for b in order], bool)
    end = run_end_s if run_end_s is not None else (
        float(releases[-1] + BEAT_S) if len(releases) else 0.0)
    per_call(calls, releases, late, end)
    opened = [c for c in calls if not c.blocked]
    live_s = sum(c.live_beats for c in opened) * BEAT_S
    glitch_s = sum(c.late_beats for c in opened) * BEAT_S
    runs = [c.longest_late_run for c in opened]
    return {
        "calls": len(calls), "opened": len(opened), "blocked": len(calls) - len(opened),
        "blocking": round((len(calls) - len(opened)) / len(calls), 6) if calls else 0.0,
        "offered_erlangs": None if offered_erlangs is None else round(offered_erlangs, 3),
        "carried_erlangs": round(live_s / end, 3) if end > 0 else 0.0,
        "refusals_by_reason": dict(Counter(r for c in calls for r in c.refused)),
        "open_wait": _spread([c.wait_s for c in opened]),
        "calls_with_late_beats": sum(c.late_beats > 0 for c in opened),
        "longest_late_run_beats": max(runs, default=0),
        "glitch_s_per_call_hour": round(glitch_s / (live_s / 3600), 3) if live_s else 0.0,
        "on_time_session_s": round(live_s - glitch_s, 3),
        # the beats the calls were matched against (every beat of the run: see the module doc)
        "beats_counted": int(len(releases)), "late_beats_counted": int(late.sum()),
    }


def records(calls: list[CallRecord]) -> list[dict]:
    """Per-call records for a result JSON (rounded; `blocked` and `wait_s` spelled out)."""
    out = []
    for c in calls:
        d = asdict(c)
        for k in ("asked_s", "opened_s", "ended_s"):
            if d[k] is not None:
                d[k] = round(d[k], 4)
        d["wait_s"] = None if c.wait_s is None else round(c.wait_s, 4)
        d["blocked"] = c.blocked
        out.append(d)
    return out
