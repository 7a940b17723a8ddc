"""The wpk probes compiled for sm_90 on this CPU (`python -m bench.harness.wpk_compile_check`): the
synchronisation must compile to the instructions meant and stay within its register budget.

Bugs these catch: a wait compiled to a relaxed or non-volatile load (no `ld.acquire`: the
compiler may hoist it and spin forever), a signal without release order or without the CTA
barrier before it, a doorbell answered with a store the host may see before the data, a
missing backoff, and a helper that blows the register budget or spills."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness.wpk_compile_check import PROBES, budget

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow       # a compiler in a subprocess; the wpk executor is off by default
def test_the_probes_compile_to_acquire_release_code_within_budget():
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-m", "bench.harness.wpk_compile_check", "--json"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {r["name"]: r for r in json.loads(run.stdout)}
    assert set(rows) == set(PROBES)
    for name, r in rows.items():
        assert r["missing"] == [], (name, r)
        assert r["spill_bytes"] == 0 and 0 < r["registers"] <= budget(name), (name, r)
