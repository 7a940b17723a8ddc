"""Every figure of the README's capacity table is what its JSON says.

Each row names its result file (`…<stem>` in the last column); its late beats, p50 / p99, late
calls and `opened` waits are recomputed from that file here and must be what the row prints.
Bugs these catch: a number typed by hand that its run does not hold (a range rounded the wrong
way, a run's figure copied from another), a row left standing after its JSON was re-measured.
"""
import json
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


def capacity_rows() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "| `…" in line]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in rows]


def result_of(cell: str) -> dict:
    stem = re.search(r"…([\w\-]+)", cell).group(1)
    found = sorted(RESULTS.glob(f"*{stem}*.json"))
    assert len(found) == 1, f"{stem}: {len(found)} result files match"
    return json.loads(found[0].read_text())


def spread(values: list[float]) -> str:
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
    return lo if lo == hi else f"{lo}–{hi}"


def opened(d: dict, after_fill: bool) -> str:
    """p50 / p99 of the open waits, each as a range over the runs (seconds); after the fill:
    the opens past the first `sessions` calls of each run (the ones dialled at once)."""
    p50, p99 = [], []
    for r in d["per_run"]:
        if after_fill:
            calls = sorted((c for c in r["calls"] if not c["blocked"]), key=lambda c: c["asked_s"])
            waits = np.array([c["wait_s"] for c in calls[d["sessions"]:]])
            p50.append(float(np.percentile(waits, 50)))
            p99.append(float(np.percentile(waits, 99)))
        else:
            p50.append(r["deadlines"]["open_wait"]["p50_ms"] / 1e3)
            p99.append(r["deadlines"]["open_wait"]["p99_ms"] / 1e3)
    return ("after the fill " if after_fill else "") + f"{spread(p50)} / {spread(p99)}"


def test_the_readme_has_a_capacity_table():
    assert len(capacity_rows()) >= 4


@pytest.mark.parametrize("row", capacity_rows(), ids=lambda row: row[0][:40])
def test_each_capacity_row_prints_what_its_json_holds(row):
    _, late, latency, late_calls, waits, cite = row
    d = result_of(cite)
    runs = d["per_run"]
    assert late.startswith(f"{d['late_beats']} of {d['beats_all']}")
    assert latency.startswith(f"{d['p50_ms']:.1f} / {d['p99_ms']:.1f}")
    if "(runs " in latency:
        each = ", ".join(f"{r['p99_ms']:.1f}" for r in runs)
        assert f"(runs {each})" in latency
    calls = sum(r["deadlines"]["calls"] for r in runs)
    late = sum(r["deadlines"]["calls_with_late_beats"] for r in runs)
    assert late_calls.startswith(f"{late} of {calls}")
    assert waits.startswith(opened(d, waits.startswith("after the fill")))
