"""One `python -m sim.run` command gives one result, and its seed is what varies it.

Bugs caught: caller lines seeded by their number only (`--seed 0` and `--seed 1` with churn gave
identical traces), `--runs 3` giving three identical runs, and a virtual-time result that
changes between two runs of one command (apart from the date, the output path and what is
measured on the wall clock: the host's CPU and GC time, kept apart for that reason).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from sim import run

WALL_CLOCK = ("loop_cpu_ms", "gc_ms")        # per-beat trace entries measured on the host


def result(tmp_path: Path, name: str, *extra: str) -> dict:
    out = tmp_path / name
    assert run.main(["--sessions", "12", "--beats", "120", "--churn", "3", "--out", str(out),
                     *extra]) == 0
    (path,) = out.glob("*.json")
    return json.loads(path.read_text())


def virtual(res: dict) -> dict:
    """The result less its date, command and wall-clock measurements."""
    res = copy.deepcopy(res)
    for key in ("date", "command"):
        res.pop(key, None)
    for r in res["per_run"]:
        r.pop("host", None)
        for beat in [r["trace"], *r.get("outside", [])]:
            for key in WALL_CLOCK:
                beat.pop(key, None)
    return res


@pytest.mark.slow
def test_one_command_one_result_and_the_seed_varies_it(tmp_path):
    a = result(tmp_path, "a", "--seed", "5", "--runs", "2")
    b = result(tmp_path, "b", "--seed", "5", "--runs", "2")
    assert virtual(a) == virtual(b)
    assert a["extra"]["seeds"] == [5, 6]
    first, second = (r["trace"]["sessions"] for r in a["per_run"])
    assert first != second, "the runs of one command were the same run"
    c = result(tmp_path, "c", "--seed", "6")
    assert c["per_run"][0]["trace"]["sessions"] == second      # run 2 of seed 5 is seed 6
    d = result(tmp_path, "d", "--seed", "7")
    assert d["per_run"][0]["trace"]["sessions"] != first
