"""bench/RESULTS.md is what bench/results_md.py makes of bench/results/, and the README stays a
short front door whose cited result files exist."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_BYTES = 10_240
RESULTS_MAX_BYTES = 30_000      # tables a reader scans; superseded runs live in git history


def test_results_md_is_what_the_generator_writes(tmp_path):
    out = tmp_path / "RESULTS.md"
    subprocess.run([sys.executable, str(ROOT / "bench" / "results_md.py"), "--out", str(out)],
                   check=True, cwd=ROOT)
    committed = (ROOT / "bench" / "RESULTS.md").read_text()
    assert out.read_text() == committed, "bench/RESULTS.md is stale: run python bench/results_md.py"


def test_results_md_stays_a_short_set_of_tables():
    """Catches runs kept after a newer one superseded them (or prose grown into the tables)."""
    size = len((ROOT / "bench" / "RESULTS.md").read_bytes())
    assert size <= RESULTS_MAX_BYTES, f"bench/RESULTS.md is {size} bytes: prune superseded runs"


def test_results_md_check_fails_on_a_stale_file(tmp_path):
    stale = tmp_path / "RESULTS.md"
    stale.write_text("# Measurements\n")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "results_md.py"), "--check",
                           "--out", str(stale)], cwd=ROOT, capture_output=True)
    assert done.returncode != 0


# a result file as the tree cites one: a path under bench/results/, or a name stamped with its
# date or its device (the form of every measured run's file)
RESULT_NAME = re.compile(r"bench/results/([\w.\-]+\.json)|\b([\w\-]+(?:\d{8}T\d{6}|-h200)"
                         r"[\w.\-]*\.json)")


def _tracked_text() -> dict[str, str]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    out = {}
    for name in names:
        if name.startswith("bench/results/") or not name.endswith((".md", ".py", ".json", ".sh")):
            continue
        out[name] = (ROOT / name).read_text(errors="ignore")
    return out


def _has_git() -> bool:
    return (ROOT / ".git").exists()


@pytest.mark.skipif(not _has_git(), reason="needs the repository's git")
def test_every_result_file_the_tree_cites_exists():
    """Catches a result pruned while a doc, a comment or a cost model still cites it."""
    results = {p.name for p in (ROOT / "bench" / "results").iterdir()}
    missing = sorted({(name, m) for name, text in _tracked_text().items()
                      if not name.startswith("tests/") and name != "bench/RESULTS.md"
                      for pair in RESULT_NAME.findall(text) for m in pair
                      if m and m not in results and "..." not in m})
    assert not missing, f"cited result files that are not in bench/results/: {missing}"


# a run cited by its stamp, shortened or as a pattern: `…n300-20261205T154628-atonce`,
# `sim-fast-dense-n300-20261204T0343*`
STAMPED = re.compile(r"(…|\.\.\.)?([\w\-]*\d{8}T\d{4}[\w\-*]*)")


def test_every_run_cited_by_its_stamp_is_in_the_results():
    """Catches a result pruned while the README or a doc still cites it in short (a stamp, a
    pattern), which the file-name check above does not read."""
    results = [p.name for p in (ROOT / "bench" / "results").iterdir()]
    missing = []
    for name, text in _tracked_text().items():
        if name.startswith("tests/") or name == "bench/RESULTS.md" or name.endswith(".json"):
            continue
        for short, stem in STAMPED.findall(text):
            pattern = (".*" if short else "") + re.escape(stem).replace(r"\*", ".*")
            if not any(re.fullmatch(pattern + r"(\.json|\.png)?", r) for r in results):
                missing.append((name, short + stem))
    assert not missing, f"runs cited by stamp that are not in bench/results/: {sorted(set(missing))}"


@pytest.mark.skipif(not _has_git(), reason="needs the repository's git")
def test_every_result_names_a_commit_of_this_history():
    """Catches a hand-set or stale commit name (a tree measured under a name git does not
    know, or a commit rewritten since): each result's commit is an ancestor of HEAD."""
    bad = []
    for path in sorted((ROOT / "bench" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        commit = data.get("commit") if isinstance(data, dict) else None
        if not commit or commit in ("unknown", "—"):
            continue
        ok = subprocess.run(["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=ROOT,
                            capture_output=True).returncode == 0
        if not ok:
            bad.append((path.name, commit))
    assert not bad, f"results naming commits outside this history: {bad}"


def test_readme_is_at_most_10_kib():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes"


def test_every_result_file_the_readme_names_exists():
    text = (ROOT / "README.md").read_text()
    cited = set(re.findall(r"bench/results/[\w.\-]+", text))
    assert cited, "the README cites no result file"
    missing = sorted(p for p in cited if not (ROOT / p).exists())
    assert not missing, f"README names result files that do not exist: {missing}"
