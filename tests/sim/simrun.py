"""`python -m sim.run` as a user runs it, for the sim tests: its one result JSON, read back."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sim_run(tmp_path: Path, *args: str, timeout: float = 600) -> dict:
    out = subprocess.run([sys.executable, "-m", "sim.run", "--out", str(tmp_path), *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-2000:]
    (path,) = tmp_path.glob("sim-*.json")
    result = json.loads(path.read_text())
    path.unlink()
    return result
