"""What `sim.fit` and `sim.validate` read of a GPU bench result: its measured beats, every run's in
order (`Measured`), checked to be a GPU's (`gpu_result`); the batch each beat replayed (the
smallest captured bucket holding its live sessions), what each beat carried where the trace
says (rows, resets, rolls, copies), the host's share of each beat, the start-row beats of older
traces and the frame-0 shares.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wave_actors.core.frames import BEAT_S


class FitError(ValueError):
    """Input the fit cannot use; one line, said to the user."""


@dataclass(frozen=True)
class Measured:
    """One GPU bench result's measured beats, every run's in order."""
    path: str
    commit: str
    backend: str
    profile: str
    context: int
    held: tuple                 # (lo, hi): the contexts the measured beats held
    gpu: str
    live: np.ndarray            # [beats] live sessions
    batch: np.ndarray           # [beats] the padded batch the engine replayed
    compute_s: np.ndarray       # [beats] the executor's time
    latency_s: np.ndarray       # [beats] release → outputs routed
    gc_s: np.ndarray            # [beats] garbage collection since the previous beat
    host_s: np.ndarray          # latency − compute of the beats after one on time (module doc)
    carried: np.ndarray | None  # [beats, 4] rows, resets, rolls, copies; None: the trace has
                                # no columns (copies: 0 where a trace has none)
    row_beats: tuple            # ((batch, rows, seconds), ...): beats with rows, no resets
    first_shares: tuple         # each run's frame-0 share of the executor's beat (p50)
    engine: dict


def padded(live: int, buckets: list[int]) -> int:
    """The batch a beat of `live` sessions replays: the smallest captured bucket holding it."""
    return min((b for b in buckets if b >= live), default=live)


def gpu_result(path: str) -> dict:
    """A bench result measured on a GPU, or FitError saying why the file is not one."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise FitError(f"{path}: not a readable bench result JSON ({exc})") from None
    if not isinstance(raw, dict) or "per_run" not in raw or "backend" not in raw:
        raise FitError(f"{path}: not a bench result (no backend or per_run)")
    if str(raw["backend"]).startswith("sim") or raw.get("virtual"):
        raise FitError(f"{path}: a sim result (backend {raw['backend']}); use GPU runs")
    if str(raw.get("gpu", "none")).startswith("none"):
        raise FitError(f"{path}: measured on no GPU ({raw.get('gpu')!r})")
    return raw


def read(path: str) -> Measured:
    raw = gpu_result(path)
    runs = [r for r in raw["per_run"] if (r.get("trace") or {}).get("compute_ms")]
    if not runs:
        raise FitError(f"{path}: no per-beat traces (per_run[].trace) to fit from")
    engine = raw.get("extra", {}).get("engine_after") or raw.get("extra", {}).get("engine", {})
    buckets = sorted(engine.get("buckets_captured") or [])
    col = lambda key: np.concatenate([np.asarray(r["trace"][key], float) for r in runs])
    live = col("sessions").astype(int)
    carried = None
    if all(k in r["trace"] for r in runs for k in CARRIED):
        copies = np.concatenate([np.asarray(r["trace"].get("copies")
                                            or np.zeros(len(r["trace"]["compute_ms"])), float)
                                 for r in runs])
        carried = np.stack([col(k) for k in CARRIED] + [copies], axis=1).astype(int)
    return Measured(path, raw.get("commit", "unknown"), raw["backend"], raw["profile"],
                    int(raw["context"]), held_context(raw), raw["gpu"], live,
                    np.array([padded(n, buckets) for n in live]), col("compute_ms") / 1e3,
                    col("latency_ms") / 1e3, col("gc_ms") / 1e3, _host(runs), carried,
                    _row_beats(raw, runs, buckets), _first_shares(runs), engine)


CARRIED = ("rows", "resets", "rolls")       # a trace's columns of what a beat carried
# and `copies` (prompt-snapshot copies), read as 0 where a trace has no such column


def first_rolls(carried: np.ndarray) -> np.ndarray:
    """[beats] True at the file's first beat that rolled a context: its runs share one
    executor (the bench prepares its backend once), whose first roll runs cold."""
    first = np.zeros(len(carried), bool)
    rolled = np.flatnonzero(carried[:, 2] > 0)
    if len(rolled):
        first[rolled[0]] = True
    return first


def _host(runs: list[dict]) -> np.ndarray:
    """Each run's latency − compute, seconds, of the beats whose previous beat was on time."""
    out = []
    for r in runs:
        lat, comp = (np.asarray(r["trace"][k], float) / 1e3 for k in ("latency_ms", "compute_ms"))
        after_late = np.r_[False, lat[:-1] > BEAT_S]
        out.append((lat - comp)[~after_late])
    return np.concatenate(out)


def held_context(raw: dict) -> tuple:
    """The contexts the measured beats held: the bench holds every session between
    `extra.context_held.from` and `.to` by rolling (the sim's slot book the same way)."""
    held = raw.get("extra", {}).get("context_held") or {}
    if "from" in held and "to" in held:
        return float(held["from"]), float(held["to"])
    return float(raw["context"]), float(raw["context"])


def _row_beats(raw: dict, runs: list[dict], buckets: list[int]) -> tuple:
    """Beats that carried start rows and reset no slot (a reset's own cost is not a row's):
    from each run's slowest ramp beats and the engine's slow beats, once each."""
    seen = set()
    for r in runs:
        for b in (r.get("ramp") or {}).get("slowest", []):
            seen.add((b["sessions"], b["rows"], b["resets"], b["compute_ms"]))
    for b in raw.get("extra", {}).get("engine_after", {}).get("slow_beats", []):
        seen.add((b["live"], b["rows"], b["resets"], b["done_ms"]))
    return tuple(sorted((padded(live, buckets), rows, ms / 1e3)
                        for live, rows, resets, ms in seen if rows and not resets))


def _first_shares(runs: list[dict]) -> tuple:
    """(first frame routed − host time before the call) / executor time, p50s, for the runs
    whose executor routes frame 0 ahead of the beat's end."""
    shares = []
    for r in runs:
        first = (r.get("first_frame") or {}).get("p50")
        before = ((r.get("host") or {}).get("before_ms") or {}).get("p50", 0.0)
        if first and r.get("compute_p50_ms") and first < r["p50_ms"] - 1.0:
            shares.append((first - before) / r["compute_p50_ms"])
    return tuple(shares)
