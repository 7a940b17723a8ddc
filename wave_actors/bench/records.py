"""What a bench run's beat records say, in the forms its result keeps: windows (every beat,
the ramp, the measured beats, the drain), the ramp's slowest beats, the host's share of a beat,
the trace of the measured beats and the calls' times from the run's start. Pure functions of
the clock's records (no sockets, no clock); the fast mode (`sim/fast/fast.py`) computes the same
forms its own way.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from wave_actors.bench import deadlines as deadline_metrics
from wave_actors.core.frames import BEAT_S
from wave_actors.core.sched.spread import spread_ms

STALLS_KEPT = 8         # the longest late wakes of a run, with their stacks, in the result


def _window(records: list, t0: float) -> dict:
    """Beats, late beats, latency p50 / p99 / max (ms) and the span of releases (s from `t0`)
    of a window of beat records."""
    if not records:
        return {"beats": 0, "late_beats": 0}
    lat = np.array([r.latency_s for r in records]) * 1000
    p50, p99, top = np.percentile(lat, [50, 99, 100])
    return {"beats": len(records), "late_beats": int(sum(r.late for r in records)),
            "p50_ms": float(p50), "p99_ms": float(p99), "max_ms": float(top),
            "from_s": round(records[0].release - t0, 3),
            "to_s": round(records[-1].release - t0 + BEAT_S, 3)}


def _windows(everything: list, measured: list, t0: float) -> dict:
    """Every beat with a live session, and its three parts: the ramp before the measured beats,
    the measured beats, the drain after them (WINDOW_OF)."""
    if measured:
        first, last = measured[0].beat, measured[-1].beat
        ramp = [r for r in everything if r.beat < first]
        drain = [r for r in everything if r.beat > last]
    else:                            # no measured beat (a run ended at a late ramp beat)
        ramp, drain = everything, []
    return {"all": _window(everything, t0), "ramp": _window(ramp, t0),
            "measured": _window(measured, t0), "drain": _window(drain, t0)}


def _workload_window(records: list, t0: float, span: tuple[float, float] | None) -> list:
    """A workload's measured beats: those released in its steady `span` (s from `t0`, after the
    occupancy form's fill), or every one."""
    if span is None:
        return list(records)
    return [r for r in records if span[0] <= r.release - t0 < span[1]]


def shifted(call: deadline_metrics.CallRecord, t0: float) -> deadline_metrics.CallRecord:
    """The call's times from `t0` (the run's start) instead of the clock's."""
    def rel(t):
        return None if t is None else t - t0
    return dataclasses.replace(call, asked_s=call.asked_s - t0, opened_s=rel(call.opened_s),
                               ended_s=rel(call.ended_s))


def _ramp(records: list, k: int = 8) -> dict:
    """The beats before the measured ones: count, backend time spread, the k slowest."""
    if not records:
        return {}
    slow = sorted(records, key=lambda r: r.compute_s, reverse=True)[:k]
    return {"beats": len(records), "compute_ms": spread_ms(r.compute_s for r in records),
            "slowest": [{"beat": r.beat, "compute_ms": round(1e3 * r.compute_s, 1),
                         "wake_ms": round(1e3 * r.wake_s, 1), "sessions": r.sessions,
                         "rows": r.rows, "resets": r.resets, "rolls": r.rolls}
                        for r in slow]}


def _outside(everything: list, measured: list, k: int = 8) -> list[dict]:
    """The k slowest beats outside the measured window (the ramp's and the drain's), each
    broken down as the trace breaks down a measured beat: where a fill's or a hang-up's late
    beat spent its time."""
    inside = {r.beat for r in measured}
    first = measured[0].beat if measured else None
    rest = sorted((r for r in everything if r.beat not in inside),
                  key=lambda r: r.latency_s, reverse=True)[:k]
    ms = lambda x: round(1e3 * x, 1)     # noqa: E731
    return [{"beat": r.beat, "window": "ramp" if first is None or r.beat < first else "drain",
             "latency_ms": ms(r.latency_s), "compute_ms": ms(r.compute_s),
             "begin_ms": ms(r.begin_s), "wake_ms": ms(r.wake_s),
             "after_ms": ms(r.latency_s - r.returned_s), "gc_ms": ms(r.gc_s),
             "loop_cpu_ms": ms(r.loop_cpu_s), "sessions": r.sessions, "rows": r.rows,
             "resets": r.resets, "rolls": r.rolls, "copies": r.copies} for r in rest]


def _worst(trace: dict, k: int = 3) -> str:
    """The k slowest beats as 'latency (backend, before the call, of which waking, after the
    call returned, garbage collection since the previous beat) @ index', ms."""
    lat = trace["latency_ms"]
    top = sorted(range(len(lat)), key=lat.__getitem__, reverse=True)[:k]
    return "  ".join(f"{lat[i]:.1f} ({trace['compute_ms'][i]:.1f}, {trace['begin_ms'][i]:.1f}, "
                     f"{trace['wake_ms'][i]:.1f}, after {lat[i] - trace['returned_ms'][i]:.1f}, "
                     f"gc {trace['gc_ms'][i]:.1f}) @{i}" for i in top)


def _host(records: list, stalls: list, cpu: dict) -> dict:
    """How late the loop woke for the release (and, for the longest late wakes, what the loop
    was running: `stalls`), the host's time before the executor's call and after its return,
    and the CPU of the loop's thread and of the node's process per beat (with the loop's per
    live session: what grows with sessions)."""
    return {"wake_ms": spread_ms(r.wake_s for r in records),
            "before_ms": spread_ms(r.begin_s + r.pack_s for r in records),
            "after_ms": spread_ms(r.latency_s - r.returned_s for r in records),
            "before_after_ms": spread_ms(r.begin_s + r.pack_s + r.latency_s - r.returned_s
                                         for r in records),
            "loop_cpu_ms": spread_ms(r.loop_cpu_s for r in records),
            "process_cpu_ms": spread_ms(r.process_cpu_s for r in records),
            # The process less its executor's stand-in for the device (the sim's hearing).
            "clock_process_cpu_ms": spread_ms(r.process_cpu_s - r.executor_cpu_s
                                              for r in records),
            "executor_cpu_ms": spread_ms(r.executor_cpu_s for r in records),
            "loop_cpu_us_per_session": round(1e6 * sum(r.loop_cpu_s for r in records)
                                             / max(1, sum(r.sessions for r in records)), 1),
            "stalls": [s.describe() for s in sorted(stalls, key=lambda s: -s.late_s)[:STALLS_KEPT]],
            "processes": cpu}



def _trace(records: list) -> dict:
    ms = lambda xs: [round(1000 * x, 1) for x in xs]
    return {"latency_ms": ms(r.latency_s for r in records),
            "compute_ms": ms(r.compute_s for r in records),
            "begin_ms": ms(r.begin_s for r in records),
            "wake_ms": ms(r.wake_s for r in records),
            "gc_ms": ms(r.gc_s for r in records),
            "loop_cpu_ms": ms(r.loop_cpu_s for r in records),
            "returned_ms": ms(r.returned_s for r in records),
            "frames_read": [r.frames_read for r in records],
            "sessions": [r.sessions for r in records],
            # what the beat carried beside its live rows: what a cost model fits their cost from
            "rows": [r.rows for r in records],
            "resets": [r.resets for r in records],
            "rolls": [r.rolls for r in records],
            "copies": [r.copies for r in records]}
