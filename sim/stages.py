"""Per-stage shape of a beat, from `bench/graph_stages.py` results: each stage's device time
(mel, perception, RNNT, thinker, talker, codec) as a line in the batch size, fixed + per session.

A fitted cost model measures whole beats at the batch sizes a GPU bench ran. The stages say how
the beat grows past them (instead of the roofline's slope) and what a faster stage would give:
a model's `stage_speedup` ({stage: factor}, edited into the JSON or given to `sim.fit`) divides
that stage's share of each beat's live rows by its factor (start rows, resets and rolls keep
their measured cost), for a what-if study on measured shapes.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

FRAMES_PER_BEAT = 2     # a stage result times one frame; a beat is two


class StagesError(ValueError):
    """A stage result that cannot be used; one line, said to the user."""


def read(paths: list[str], profile: str) -> dict:
    """{"stages": {name: [fixed_s, per_session_s]} a beat, "_stages_from": [...]}, a line per
    stage fitted by least squares over every batch size of the files (of `profile`)."""
    points: dict[str, list[tuple[int, float]]] = {}
    sources = []
    for path in paths:
        try:
            raw = json.loads(Path(path).read_text())
            per_n = raw["stage_ms"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StagesError(f"{path}: not a graph_stages result ({exc})") from None
        if raw.get("profile") != profile:
            raise StagesError(f"{path}: profile {raw.get('profile')!r}, the runs' is {profile!r}")
        for n, stages in per_n.items():
            for name, ms in stages.items():
                points.setdefault(name, []).append((int(n), FRAMES_PER_BEAT * float(ms) / 1e3))
        sources.append({"file": Path(path).name, "commit": raw.get("commit"),
                        "sessions": sorted(int(n) for n in per_n)})
    lines = {}
    for name, pts in points.items():
        n, s = np.array(pts, float).T
        if len(set(n)) < 2:
            raise StagesError(f"stage {name}: one batch size; a line needs two")
        per, fixed = np.polyfit(n, s, 1)
        lines[name] = [round(float(max(fixed, 0.0)), 7), round(float(max(per, 0.0)), 9)]
    return {"stages": lines, "_stages_from": sources}


def speedups(specs: list[str], stages: dict) -> dict:
    """`stage=factor` words as {stage: factor}; a stage the model has not, or a factor not
    above zero, is an error."""
    out = {}
    for spec in specs:
        name, _, value = spec.partition("=")
        try:
            factor = float(value)
        except ValueError:
            factor = 0.0
        if name not in stages or not factor > 0:
            raise StagesError(f"--stage-speedup {spec!r}: want stage=factor, a stage of "
                              f"{sorted(stages)} and a factor above 0")
        out[name] = factor
    return out
