"""What a capacity bench run records: the result schema (`RunResult`, one run; `BenchResult`,
the JSON a run of the bench writes) that `sim` and the plots read too, the windows each number
covers, and the commit and device a result was measured on.
"""
from __future__ import annotations

import datetime as dt
import json
import platform
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path


from wave_actors.bench.provenance import provenance

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
WARMUP_BEATS = 8            # on-time beats in a row before measuring
WARMUP_MAX = 64             # beats of warm-up at most


# Which beats each number of a run covers (written into the bench's results as `window_of`;
# a result without it, such as the fast mode's, says nothing of its windows).
WINDOW_OF = {
    "all": "every beat with a live session, from the first open to the last close (ramp + "
           "measured + drain): beats, late_beats, p50_ms, p99_ms, max_ms, deadlines (each call "
           "over its whole life), calls, opens and open waits, refusals, underruns, dropped, "
           "frames_in, frames_out",
    "measured": "the --beats beats once every caller is live and the warm-up is on time (a "
                "workload: its window_s after the fill, else every beat): windows.measured, "
                "trace, mean_compute_ms, compute_p50_ms, compute_p99_ms, backlog_ms, live, host, "
                "first_frame",
    "ramp": "the beats before the measured ones (callers dialling in, the warm-up): "
            "windows.ramp; `ramp` breaks the backend's time down, start-only beats included",
    "drain": "the beats after the measured ones until the last close: windows.drain",
    "outside": "the slowest beats of the ramp and the drain, each broken down as the trace "
               "breaks down a measured beat: outside",
}


@dataclass
class RunResult:
    sessions: int
    beats: int            # all beats (WINDOW_OF); windows.measured.beats: the --beats window
    late_beats: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    mean_compute_ms: float
    underruns: int
    dropped: int
    refusals: int
    frames_in: int
    frames_out: int
    errors: int
    # the backend's own time per beat: what of the latency above it is host work
    compute_p50_ms: float = 0.0
    compute_p99_ms: float = 0.0
    # every measured beat in order, ms to 0.1: latency, the backend's time, the host's time
    # before the backend was called and how much of it the loop took to wake, and the frames
    # read since the previous beat: where a tail comes from
    trace: dict = field(default_factory=dict)
    # how far behind its release the first measured beat woke: a start-up backlog the warm-up
    # did not drain (every beat that still waits on it is late, whatever the beat costs)
    backlog_ms: float = 0.0
    # sessions opened in the run (with --churn, more than `sessions`), and how long their opens
    # waited for `opened` (the session's start on the model)
    opens: int = 0
    open_p50_ms: float = 0.0
    open_p99_ms: float = 0.0
    # the start and clock policies the run's node ran with: name, class, parameters and what
    # the start policy counted (beats held back, starts given up, its step's measured cost)
    policies: dict = field(default_factory=dict)
    open_max_ms: float = 0.0
    # refused opens by the node's reason, and live sessions per measured beat against those
    # offered: min / p50 / max
    refusals_by_reason: dict = field(default_factory=dict)
    live: dict = field(default_factory=dict)
    # the host's share of the beat, ms at p50 / p99 / max: how late the loop woke for the
    # release, release → the executor called, and the executor done → outputs routed; and
    # `stalls`: each late wake in the measured beats with the loop's stacks sampled meanwhile
    host: dict = field(default_factory=dict)
    # --burst: the callers dialled at once onto the steady node (the measured beats begin
    # then): how many, how long they waited for `opened` (p50 / p99 / max ms), refusals
    burst: dict = field(default_factory=dict)
    # the beats before the measured ones (sessions starting, a backlog draining): how many,
    # the backend's time p50 / p99 / max, and the slowest with what each carried
    ramp: dict = field(default_factory=dict)
    # release → the beat's first frame routed, ms at p50 / p99 / max: ahead of the beat's
    # latency when the backend finishes frame 0 early (`Capabilities.first_frame`)
    first_frame: dict = field(default_factory=dict)
    # the node's own time of the opens (`NodeMetrics.open_timed`), ms p50 / p99 / max by
    # phase: admit (read to slot held), start (to planned into a beat), answer (to `opened`
    # sent); the rest of a caller's wait is the way to the node and back
    open_phases: dict = field(default_factory=dict)
    # every open's wait for `opened`, ms to 0.1, in the order they were asked (`sim.plot`)
    open_waits_ms: list = field(default_factory=list)
    # every call's record (`wave_actors.bench.deadlines.records`: dialled, opened or blocked,
    # ended, refusals, its late beats and longest run of them) and the run's deadline metrics
    calls: list = field(default_factory=list)
    deadlines: dict = field(default_factory=dict)
    # beats, late_beats, p50_ms, p99_ms, max_ms and from_s / to_s (releases, seconds from the
    # run's start) of each window: all, ramp, measured, drain (WINDOW_OF)
    windows: dict = field(default_factory=dict)
    window_of: dict = field(default_factory=dict)
    outside: list = field(default_factory=list)     # the slowest ramp and drain beats
    # the clock's prompt-snapshot index at the run's end (hits, prefix hits, misses, saves,
    # evictions, kept, bytes; the node's warm-up's miss and save included) and the warm-up
    snapshots: dict = field(default_factory=dict)


@dataclass
class BenchResult:
    backend: str
    profile: str
    context: int
    sessions: int
    runs: int
    beats: int            # --beats: the measured window of each run
    late_beats: int       # of all beats of every run (beats_all); p50_ms, p99_ms: the worst run's
    p50_ms: float
    p99_ms: float
    virtual: bool
    gpu: str
    commit: str
    date: str
    command: str
    policy: dict = field(default_factory=dict)      # start and clock: name, class, parameters
    per_run: list[dict] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    beats_all: int = 0    # beats late_beats counts: all beats of every run (WINDOW_OF)
    # the measured windows alone: their beats and late beats over the runs, the worst p50 / p99
    measured: dict = field(default_factory=dict)
    window_of: dict = field(default_factory=dict)   # as RunResult's, and the top's fields
    provenance: dict = field(default_factory=dict)  # commit, dirty, changed files, from where


def git_commit() -> str:
    """The commit the code ran at, from git or the tree's checked manifest (see
    `wave_actors.bench.provenance`, which also says whether the tree differed from it)."""
    return provenance()["commit"]


def _gpu_name() -> str:
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"none ({platform.processor() or platform.machine()})"


def summarize(args, n: int, runs: list[RunResult], extra: dict) -> BenchResult:
    policy = {kind: {k: d[k] for k in ("name", "class", "params")}
              for kind, d in runs[0].policies.items()} if runs and runs[0].policies else {}
    measured = [r.windows.get("measured") or {"beats": 0, "late_beats": 0} for r in runs]
    prov = provenance()
    return BenchResult(args.backend, args.profile, args.context, n, len(runs), args.beats,
                       sum(r.late_beats for r in runs), max(r.p50_ms for r in runs),
                       max(r.p99_ms for r in runs), args.virtual, _gpu_name(), prov["commit"],
                       dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                       getattr(args, "command", None)
                       or "python -m wave_actors.bench " + " ".join(sys.argv[1:]),
                       policy, [asdict(r) for r in runs], extra,
                       beats_all=sum(r.beats for r in runs),
                       window_of={"beats": "measured", "beats_all, late_beats, p50_ms, p99_ms":
                                  "all", **WINDOW_OF},
                       measured={"beats": sum(m["beats"] for m in measured),
                                 "late_beats": sum(m["late_beats"] for m in measured),
                                 "p50_ms": max((m.get("p50_ms", 0.0) for m in measured),
                                               default=0.0),
                                 "p99_ms": max((m.get("p99_ms", 0.0) for m in measured),
                                               default=0.0)},
                       provenance=prov)


def write(result: BenchResult, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = result.date.replace(":", "").replace("-", "")[:15]
    path = out_dir / f"{result.backend}-{result.profile}-n{result.sessions}-{stamp}.json"
    path.write_text(json.dumps(asdict(result), indent=1) + "\n")
    return path
