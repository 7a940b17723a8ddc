"""bench/RESULTS.md is what bench/results_md.py makes of bench/results/, and the README stays a
short front door whose cited result files exist."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README_MAX_BYTES = 10_240


def test_results_md_is_what_the_generator_writes(tmp_path):
    out = tmp_path / "RESULTS.md"
    subprocess.run([sys.executable, str(ROOT / "bench" / "results_md.py"), "--out", str(out)],
                   check=True, cwd=ROOT)
    committed = (ROOT / "bench" / "RESULTS.md").read_text()
    assert out.read_text() == committed, "bench/RESULTS.md is stale: run python bench/results_md.py"


def test_results_md_check_fails_on_a_stale_file(tmp_path):
    stale = tmp_path / "RESULTS.md"
    stale.write_text("# Measurements\n")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "results_md.py"), "--check",
                           "--out", str(stale)], cwd=ROOT, capture_output=True)
    assert done.returncode != 0


def test_every_finding_cites_files_that_exist():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import results_md
    finally:
        sys.path.remove(str(ROOT / "bench"))
    missing = [f for _, _, files, _ in results_md.NOTES for f in files
               if not (ROOT / "bench" / "results" / f).exists()]
    assert not missing, f"findings in bench/results_md.py cite missing files: {missing}"


def test_readme_is_at_most_10_kib():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes"


def test_every_result_file_the_readme_names_exists():
    text = (ROOT / "README.md").read_text()
    cited = set(re.findall(r"bench/results/[\w.\-]+", text))
    assert cited, "the README cites no result file"
    missing = sorted(p for p in cited if not (ROOT / p).exists())
    assert not missing, f"README names result files that do not exist: {missing}"
