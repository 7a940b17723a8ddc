"""A result names the code it ran from git itself, or from a manifest checked file by file.

Bugs these catch: a hand-set commit trusted as given (the environment naming a commit the tree
is not at); a dirty tree recorded as clean; a copy whose files were edited after its manifest
was written (or a manifest carried onto another tree) recorded as the manifest's commit, clean;
a copy with a stale `.git` recorded at that older commit; a manifest left behind recorded
after the tree moved on.
"""
import shutil
import subprocess

import pytest

from wave_actors.bench import provenance as P


def _git(root, *args):
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / "README.md").write_text("hello\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    return root


def test_git_names_the_commit_and_a_dirty_tree(repo, monkeypatch):
    monkeypatch.setenv("WAVE_COMMIT", "deadbee")          # never trusted
    got = P.provenance(repo)
    assert got == {"commit": _git(repo, "rev-parse", "--short", "HEAD"), "dirty": False,
                   "changed": [], "source": "git"}
    (repo / "pkg" / "a.py").write_text("A = 2\n")
    got = P.provenance(repo)
    assert got["dirty"] and got["changed"] == ["pkg/a.py"]
    assert P.stamp(repo) == {"commit": got["commit"], "provenance": got}


def test_a_copy_without_git_is_judged_by_its_manifest(repo, tmp_path):
    P.write_manifest(repo)
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git"))
    commit = _git(repo, "rev-parse", "--short", "HEAD")
    assert P.provenance(copy) == {"commit": commit, "dirty": False, "changed": [],
                                  "source": "manifest"}
    (copy / "README.md").write_text("edited after the manifest\n")
    (copy / "pkg" / "a.py").unlink()
    got = P.provenance(copy)
    assert got["commit"] == commit and got["dirty"]
    assert sorted(got["changed"]) == ["README.md", "pkg/a.py"]


def test_a_manifest_written_on_a_dirty_tree_says_so(repo, tmp_path):
    (repo / "pkg" / "a.py").write_text("A = 3\n")
    P.write_manifest(repo)
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git"))
    got = P.provenance(copy)
    assert got["dirty"] and "pkg/a.py" in got["changed"]


def test_no_git_and_no_manifest_is_unknown(tmp_path):
    (tmp_path / "x.py").write_text("")
    assert P.provenance(tmp_path) == {"commit": "unknown", "dirty": None, "changed": [],
                                      "source": "none"}


def test_an_unreadable_manifest_is_dirty_not_trusted(tmp_path):
    (tmp_path / P.MANIFEST).write_text("{not json")
    got = P.provenance(tmp_path)
    assert got["commit"] == "unknown" and got["dirty"] is True


def test_a_stale_git_in_a_copy_loses_to_its_manifest(repo, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy)                      # .git included: it will go stale
    old = _git(repo, "rev-parse", "--short", "HEAD")
    (repo / "pkg" / "a.py").write_text("A = 4\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two")
    P.write_manifest(repo)
    shutil.copytree(repo, copy, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))
    got = P.provenance(copy)
    assert got["commit"] == _git(repo, "rev-parse", "--short", "HEAD") != old
    assert got == {"commit": got["commit"], "dirty": False, "changed": [], "source": "manifest"}


def test_a_manifest_left_behind_yields_to_git_once_the_tree_moves_on(repo):
    P.write_manifest(repo)
    (repo / "pkg" / "a.py").write_text("A = 5\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "three")
    got = P.provenance(repo)
    assert got["source"] == "git" and not got["dirty"]
    assert got["commit"] == _git(repo, "rev-parse", "--short", "HEAD")
