"""Workloads: when calls arrive, how long they last and how their callers behave.

A workload is a list of `Call`s, read from a file or drawn by a seeded generator:

    --workload calls.csv                      (or .jsonl: one object a line)
    --workload poisson:rate=2,duration=600,call=90
    --workload poisson:occupancy=0.95,hold=120[,slots=300][,duration=1000]
    --workload diurnal:peak=3,duration=1200,period=1200,trough=0.2
    --workload bursty:rate=2,duration=600,on=20,off=40
    --workload flash:rate=1,duration=600,at=200,calls=150,width=10
    --workload retry:rate=1,duration=600,at=200,calls=150,width=10,redials=8,after=0.5

`poisson:occupancy=X,hold=H` is Poisson arrivals at a target occupancy: X (0 < X <= 1) of the
node's slots busy on average with calls of exponential length, mean H seconds (`hold` is `call`'s
other name), so the rate is X * slots / H a second. The slots come from `slots=N` or, without
it, from whoever loads the spec (the bench passes its --sessions). Without `duration` the calls
arrive for a fill of FILL_HOLDS mean holds (the occupancy reaches 1 - e^-3 = 95 % of its target)
plus a measured span (`beats` beats, default DEFAULT_BEATS: the bench passes its --beats); the
workload records that span as `window_s`, where a run measures its steady state.

A file's columns (CSV header or JSON keys) are `Call`'s fields; only `at_s` and `duration_s`
are required. Every generator's random choice comes from the seed it is given (the run's
`--seed`), so one command draws one workload. Time 0 is the run's start; calls are sorted by
arrival.

Pure data (no sockets, no clock): the benchmark's callers and the fast mode both read it.
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from wave_actors.core.frames import BEAT_S


class WorkloadError(ValueError):
    pass


@dataclass(frozen=True)
class Call:
    at_s: float                     # arrival: seconds from the run's start
    duration_s: float               # how long the caller stays once the call is opened
    prompt_chars: int = 0           # system prompt (instructions) length, characters
    tools: int = 0                  # tools the caller declares
    talk_s: float = 1.0             # the caller talks in bursts this long ...
    silence_s: float = 0.7          # ... with pauses this long between them
    jitter_ms: float = 0.0          # each frame is sent up to this late (uniform)
    loss: float = 0.0               # share of the caller's frames its network loses
    redials: int = 0                # a refused call dials again up to this many times
    redial_after_s: float = 1.0     # after this long, times `redial_backoff` each further try
    redial_backoff: float = 1.0

    def __post_init__(self) -> None:
        bad = []
        if not (math.isfinite(self.at_s) and self.at_s >= 0):
            bad.append("at_s >= 0")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            bad.append("duration_s > 0")
        if self.prompt_chars < 0 or self.tools < 0 or self.redials < 0:
            bad.append("prompt_chars, tools and redials >= 0")
        if self.talk_s <= 0 or self.silence_s < 0:
            bad.append("talk_s > 0 and silence_s >= 0")
        if not 0 <= self.loss < 1 or self.jitter_ms < 0:
            bad.append("0 <= loss < 1 and jitter_ms >= 0")
        if self.redial_after_s < 0 or self.redial_backoff < 1:
            bad.append("redial_after_s >= 0 and redial_backoff >= 1")
        if bad:
            raise WorkloadError(f"call {self}: needs {', '.join(bad)}")


FIELDS = {f.name: f.type for f in fields(Call)}


@dataclass(frozen=True)
class Workload:
    calls: tuple[Call, ...]
    source: dict = field(default_factory=dict)     # how it was made: generator and params, or file

    @property
    def horizon_s(self) -> float:
        """Until the last call would end if it were opened on arrival."""
        return max((c.at_s + c.duration_s for c in self.calls), default=0.0)

    @property
    def arrivals_end_s(self) -> float:
        return max((c.at_s for c in self.calls), default=0.0)

    @property
    def window_s(self) -> tuple[float, float] | None:
        """The steady span a run measures (the occupancy form's, after its fill), seconds from
        the start; None: no fill, every beat is steady."""
        span = (self.source.get("occupancy") or {}).get("window_s")
        return tuple(span) if span else None

    def offered_erlangs(self) -> float:
        """Offered load: call-seconds asked for over the span arrivals come in."""
        span = self.arrivals_end_s
        if span <= 0:
            return float(len(self.calls))
        return sum(c.duration_s for c in self.calls) / span

    def describe(self) -> dict:
        return {**self.source, "calls": len(self.calls), "horizon_s": round(self.horizon_s, 3),
                "offered_erlangs": round(self.offered_erlangs(), 3)}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        rows = [asdict(c) for c in self.calls]
        if path.suffix == ".csv":
            with path.open("w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=list(FIELDS))
                w.writeheader()
                w.writerows(rows)
        else:
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path


# -- files ------------------------------------------------------------------------------------
def _call_from(row: dict, where: str) -> Call:
    unknown = set(row) - set(FIELDS)
    if unknown:
        raise WorkloadError(f"{where}: unknown field(s) {sorted(unknown)}; known: {list(FIELDS)}")
    for need in ("at_s", "duration_s"):
        if row.get(need) in (None, ""):
            raise WorkloadError(f"{where}: {need} is required")
    kw = {}
    for key, value in row.items():
        if value in (None, ""):
            continue
        try:
            kw[key] = float(value) if FIELDS[key] == "float" else _as_int(value)
        except (TypeError, ValueError):
            raise WorkloadError(f"{where}: {key}={value!r} is not a {FIELDS[key]}") from None
    try:
        return Call(**kw)
    except WorkloadError as exc:
        raise WorkloadError(f"{where}: {exc}") from None


def _as_int(value) -> int:
    number = float(value)
    if not number.is_integer():
        raise ValueError(value)
    return int(number)


def load_file(path: str | Path) -> Workload:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise WorkloadError(f"{path}: {exc.strerror or exc}") from None
    calls = []
    if path.suffix == ".csv":
        reader = csv.DictReader(text.splitlines())
        if not reader.fieldnames:
            raise WorkloadError(f"{path}: empty (a CSV needs a header: at_s,duration_s,...)")
        for i, row in enumerate(reader, start=2):
            calls.append(_call_from(row, f"{path}:{i}"))
    elif path.suffix in (".jsonl", ".ndjson", ".json"):
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{path}:{i}: not JSON: {exc.msg}") from None
            if not isinstance(row, dict):
                raise WorkloadError(f"{path}:{i}: a call is a JSON object")
            calls.append(_call_from(row, f"{path}:{i}"))
    else:
        raise WorkloadError(f"{path}: a workload file is .csv or .jsonl")
    if not calls:
        raise WorkloadError(f"{path}: no calls")
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return Workload(tuple(sorted(calls, key=lambda c: c.at_s)),
                    {"kind": "file", "path": str(path), "sha256_16": digest})


# -- generators -------------------------------------------------------------------------------
def lengths(rng: np.random.Generator, n: int, mean_s: float) -> np.ndarray:
    """Call lengths: exponential of the mean, at least one beat's worth of a second."""
    return np.maximum(0.5, rng.exponential(mean_s, n))


def _thinned(rng, duration_s: float, peak: float, rate_at) -> np.ndarray:
    """Arrival times of a Poisson process of rate `rate_at(t)` ≤ `peak` on [0, duration)."""
    n = rng.poisson(peak * duration_s)
    t = np.sort(rng.uniform(0.0, duration_s, n))
    keep = rng.uniform(0.0, peak, n) < rate_at(t)
    return t[keep]


def poisson(rng, rate: float, duration: float, call: float = 90.0) -> np.ndarray:
    return _thinned(rng, duration, rate, lambda t: np.full_like(t, rate))


def diurnal(rng, peak: float, duration: float, period: float = 0.0, trough: float = 0.2,
            call: float = 90.0) -> np.ndarray:
    """A day compressed into `period` seconds (default: the whole run): the rate swings as a
    cosine from `trough`·peak at the start to `peak` half a period in."""
    period = period or duration
    shape = lambda t: trough + (1 - trough) * 0.5 * (1 - np.cos(2 * np.pi * t / period))
    return _thinned(rng, duration, peak, lambda t: peak * shape(t))


def bursty(rng, rate: float, duration: float, on: float = 20.0, off: float = 40.0,
           call: float = 90.0) -> np.ndarray:
    """On/off (a two-state Markov-modulated Poisson process): periods of `rate` arrivals
    lasting ~`on` s (exponential), silent periods of ~`off` s between them."""
    times, t, active = [], 0.0, True
    while t < duration:
        span = min(duration - t, rng.exponential(on if active else off))
        if active:
            times.append(t + np.sort(rng.uniform(0.0, span, rng.poisson(rate * span))))
        t += span
        active = not active
    return np.concatenate(times) if times else np.zeros(0)


def flash(rng, rate: float, duration: float, at: float, calls: int, width: float = 10.0,
          call: float = 90.0) -> np.ndarray:
    """Background Poisson arrivals plus `calls` more within `width` s from `at` (a crowd
    answering the same broadcast)."""
    base = poisson(rng, rate, duration)
    crowd = at + rng.uniform(0.0, width, int(calls))
    return np.sort(np.concatenate([base, crowd[crowd < duration]]))


GENERATORS = {"poisson": poisson, "diurnal": diurnal, "bursty": bursty, "flash": flash,
              "retry": flash}
# Caller behaviour a generator's spec may set beside its arrival parameters.
CALLER_KEYS = {"prompt": "prompt_chars", "tools": "tools", "jitter": "jitter_ms", "loss": "loss",
               "redials": "redials", "after": "redial_after_s", "backoff": "redial_backoff",
               "talk": "talk_s", "silence": "silence_s"}
# A retry storm is a flash crowd whose callers redial fast and often when refused.
RETRY_DEFAULTS = {"redials": 8, "after": 0.5, "backoff": 1.0}


def parse_spec(spec: str) -> tuple[str, dict]:
    name, _, rest = spec.partition(":")
    if name not in GENERATORS:
        raise WorkloadError(f"{spec!r}: not a file and not a generator ({', '.join(GENERATORS)})")
    params = {}
    for pair in filter(None, rest.split(",")):
        key, eq, value = pair.partition("=")
        if not eq:
            raise WorkloadError(f"{spec!r}: generator parameters are key=value, comma-separated")
        try:
            params[key.strip()] = float(value)
        except ValueError:
            raise WorkloadError(f"{spec!r}: {key}={value!r} is not a number") from None
    return name, params


FILL_HOLDS = 3.0        # occupancy form: arrivals fill the node for this many mean holds ...
DEFAULT_BEATS = 500     # ... then run this many beats (without a `beats` from the caller)


def _occupancy(spec: str, name: str, params: dict, slots: int | None,
               beats: int | None) -> dict:
    """poisson:occupancy=X,hold=H[,slots=N][,duration=D]: the rate X * slots / H put into
    `params` (and a default duration); what was resolved, for the workload's record."""
    occupancy, given = params.pop("occupancy", None), params.pop("slots", None)
    if occupancy is None:
        if given is not None:
            raise WorkloadError(f"{spec!r}: slots= is only for the occupancy form "
                                f"(poisson:occupancy=0.95,hold=120,slots=N)")
        return {}
    if name != "poisson":
        raise WorkloadError(f"{spec!r}: occupancy= is poisson's (poisson:occupancy=0.95,hold=120)")
    if "rate" in params:
        raise WorkloadError(f"{spec!r}: give rate= or occupancy=, not both (occupancy sets the "
                            f"rate: occupancy * slots / hold)")
    if not 0 < occupancy <= 1:
        raise WorkloadError(f"{spec!r}: occupancy is the share of the slots busy on average: "
                            f"0 < occupancy <= 1")
    hold = params.get("call", 90.0)
    if not hold > 0:
        raise WorkloadError(f"{spec!r}: hold (the mean call length, seconds) must be > 0")
    if given is not None:
        slots = given
    if slots is None:
        raise WorkloadError(f"{spec!r}: occupancy needs the node's slots: add slots=N (the bench "
                            f"passes its --sessions)")
    if not (float(slots).is_integer() and slots >= 1):
        raise WorkloadError(f"{spec!r}: slots={slots!r} must be a whole number >= 1")
    slots = int(slots)
    params["rate"] = occupancy * slots / hold
    fill_s, measure_s = FILL_HOLDS * hold, (beats or DEFAULT_BEATS) * BEAT_S
    if params.get("duration") is None:
        params["duration"] = fill_s + measure_s
    if not params["duration"] > 0:
        raise WorkloadError(f"{spec!r}: duration (seconds of arrivals) must be > 0")
    end = min(params["duration"], fill_s + measure_s)
    return {"occupancy": occupancy, "slots": slots, "hold_s": hold,
            "rate_per_s": round(params["rate"], 6), "target_erlangs": round(occupancy * slots, 3),
            "fill_s": fill_s,
            # the steady span a run measures: after the fill, while calls still arrive
            "window_s": [round(fill_s, 3), round(end, 3)] if end > fill_s else None}


def generate(spec: str, seed: int, *, slots: int | None = None,
             beats: int | None = None) -> Workload:
    """The generator `spec` drawn from `seed`. `slots` (the node's) and `beats` (to measure)
    fill in what the occupancy form does not say (`slots=` and `duration=` in the spec win)."""
    name, params = parse_spec(spec)
    if name == "retry":
        params = {**RETRY_DEFAULTS, **params}
    if "hold" in params:
        if "call" in params:
            raise WorkloadError(f"{spec!r}: hold and call are both the mean call length: give "
                                f"one")
        params["call"] = params.pop("hold")
    caller = {CALLER_KEYS[k]: params.pop(k) for k in list(params) if k in CALLER_KEYS}
    for key in ("prompt_chars", "tools", "redials"):
        if key in caller:
            caller[key] = int(caller[key])
    resolved = _occupancy(spec, name, params, slots, beats)
    mean_call = params.get("call", 90.0)
    if any(v < 0 for v in params.values()) or mean_call <= 0:
        raise WorkloadError(f"{spec!r}: parameters are >= 0 and call > 0")
    rng = np.random.default_rng([seed, 0x5717])
    try:
        at = GENERATORS[name](rng, **params)
    except TypeError as exc:
        raise WorkloadError(f"{spec!r}: {exc}") from None
    durations = lengths(rng, len(at), mean_call)
    calls = tuple(Call(at_s=round(float(a), 6), duration_s=round(float(d), 6), **caller)
                  for a, d in zip(at, durations))
    if not calls:
        raise WorkloadError(f"{spec!r}: drew no calls (raise the rate or the duration)")
    source = {"kind": name, "spec": spec, "params": {**params, **caller}, "seed": seed}
    if resolved:
        source["occupancy"] = resolved
    return Workload(calls, source)


def load(spec: str, seed: int = 0, *, slots: int | None = None,
         beats: int | None = None) -> Workload:
    """A workload file's path, or a generator spec (`name:key=value,...`) drawn from `seed`
    (`slots`, `beats`: the occupancy form's defaults, `generate`)."""
    if Path(spec).suffix in (".csv", ".jsonl", ".ndjson", ".json") or Path(spec).exists():
        return load_file(spec)
    return generate(spec, seed, slots=slots, beats=beats)
