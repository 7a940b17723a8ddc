"""`sim/README.md` runs as written: every fenced `bash` block of the guide, from the repository
root, with its outputs in a temporary folder; blocks that read what an earlier one wrote run
after it, in one test, and the independent chains run as tests of their own.

Bugs caught: a flag renamed or a file moved under the guide (a command that fails), a step
that stops writing what the next one reads (the plots, the SLO results, the fitted model), and
a guide step that writes into bench/results. To stay near a minute on 2 cores, the day is cut
to 300 s, the full node's trace to 20 s of arrivals, the SLO search and the validation to one
seed and the validation's fast-mode draws to 40 (the fewest it judges by an interval); the
commands are otherwise the guide's own."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "sim" / "README.md"
SCALE_DOWN = {"duration=1800": "duration=300", "duration=120,call=30": "duration=20,call=10",
              "out/ab/fit.json --seeds 3": "out/ab/fit.json --seeds 1 --draws 40",
              "--seeds 3": "--seeds 1"}


def blocks(text: str) -> list[str]:
    """The guide's fenced bash blocks (set-up is in a plain fence: it is not run here)."""
    return re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)


def scaled(block: str, out: Path) -> str:
    for old, new in {**SCALE_DOWN, "out/ab": str(out)}.items():
        block = block.replace(old, new)
    return block


# The guide's steps by what each reads: a chain runs in order, the chains apart (in parallel
# under xdist), each with what it must leave behind.
CHAINS = {
    "a day, fast runs, plots": ((0, 1, 3), ["day.csv", "plots/compare.png", "plots/blocking.png",
                                            "plots/*-calls.png", "plots/*-calls.png"]),
    "full runs": ((2,), ["full-eager/*.json"]),
    "an SLO search and its plot": ((4,), ["plots-slo/blocking.png", "plots-slo/*.png"]),
    "a fit, then validation": ((5,), ["fit.json"]),
    "a fit with a stage sped up": ((6,), ["fast-talker.json"]),
}


def test_the_guide_has_each_step_and_scales_down():
    text = GUIDE.read_text()
    steps = blocks(text)
    assert len(steps) == 7
    assert sorted(i for chain, _ in CHAINS.values() for i in chain) == list(range(len(steps)))
    for tool in ("wave_actors.bench.workload", "sim.run --fast", "sim.run --sessions", "sim.plot",
                 "sim.slo", "sim.fit", "sim.validate", "--stage-speedup"):
        assert any(tool in b for b in steps), tool
    for old in SCALE_DOWN:                          # a guide edit must keep the test short
        assert old in text, old


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CHAINS))
def test_every_command_of_the_guide_runs(tmp_path, name):
    results = ROOT / "bench" / "results"
    before = sorted(p.name for p in results.iterdir())
    out = tmp_path / "ab"
    out.mkdir()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    steps, leaves = CHAINS[name]
    guide = blocks(GUIDE.read_text())
    for block in (guide[i] for i in steps):
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", scaled(block, out)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{block}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    for pattern in set(leaves):                     # a pattern listed twice: two files
        assert len(list(out.glob(pattern))) == leaves.count(pattern), pattern
    assert sorted(p.name for p in results.iterdir()) == before
