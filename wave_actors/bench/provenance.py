"""Which code a measurement ran: the commit, and whether the tree differed from it.

From git itself, or from a manifest written when a copy of the tree was made: a copy sent to
another machine may have no `.git`, or a stale one that names an older commit. The manifest
holds the commit, whether the tree was dirty then, and the git blob id of every tracked file.
Read back, each file is hashed again: a manifest every file still matches names the code that
runs; one that some file no longer matches is stale, and git decides where there is a git (the
tree has moved on since), else the manifest's commit is recorded dirty with the files named.
Nothing is taken on trust from the environment.

    python -m wave_actors.bench.provenance write     # before copying the tree to another machine
    python -m wave_actors.bench.provenance           # what a run here would record
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ".wave-manifest.json"
SHOWN = 20          # changed files named in a record, at most


def blob_id(data: bytes) -> str:
    """The id git gives a file of these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _git(root: Path, *args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def _has_git(root: Path) -> bool:
    return (root / ".git").exists() and _git(root, "rev-parse", "--show-toplevel") is not None


def from_git(root: Path = ROOT) -> dict | None:
    """commit (short), dirty (tracked files differ from it) and the changed files; None
    where `root` is not a git work tree."""
    if not _has_git(root):
        return None
    head = _git(root, "rev-parse", "--short", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    if head is None or status is None:
        return None
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    return {"commit": head.strip(), "dirty": bool(changed), "changed": changed[:SHOWN],
            "source": "git"}


def _file_ids(root: Path, paths) -> dict[str, str | None]:
    out = {}
    for p in paths:
        f = root / p
        out[p] = blob_id(f.read_bytes()) if f.is_file() and not f.is_symlink() else None
    return out


def write_manifest(root: Path = ROOT) -> Path:
    """The manifest of this work tree (its commit, dirty or not, each tracked file's blob id
    as the file is now), written at the tree's root."""
    info = from_git(root)
    if info is None:
        raise RuntimeError(f"{root} is not a git work tree: nothing to write a manifest from")
    listed = _git(root, "ls-files", "-z") or ""
    files = _file_ids(root, sorted(p for p in listed.split("\0") if p))
    path = root / MANIFEST
    path.write_text(json.dumps({"commit": info["commit"], "dirty": info["dirty"],
                                "changed": info["changed"], "files": files}, indent=0) + "\n")
    return path


def _checked_manifest(root: Path) -> tuple[dict | None, bool]:
    """(what the manifest records, whether some file no longer matches it); (None, False)
    where there is none. An unreadable manifest records an unknown commit, dirty."""
    path = root / MANIFEST
    if not path.is_file():
        return None, False
    try:
        m = json.loads(path.read_text())
        files, commit = dict(m["files"]), str(m["commit"])
    except (ValueError, KeyError, TypeError) as exc:
        return {"commit": "unknown", "dirty": True, "changed": [],
                "source": f"manifest unreadable: {exc}"}, True
    now = _file_ids(root, files)
    changed = [p for p, b in files.items() if now[p] != b]
    return {"commit": commit, "dirty": bool(m.get("dirty")) or bool(changed),
            "changed": (list(m.get("changed", [])) + changed)[:SHOWN],
            "source": "manifest"}, bool(changed)


def from_manifest(root: Path = ROOT) -> dict | None:
    """The manifest's commit, dirty where it says so or where a file it names differs now;
    None where there is no manifest."""
    return _checked_manifest(root)[0]


def provenance(root: Path = ROOT) -> dict:
    """What a result records of the code it ran: a manifest every file still matches, else
    git, else the stale manifest (dirty), else unknown."""
    manifest, stale = _checked_manifest(root)
    if manifest is not None and not stale:
        return manifest
    return (from_git(root) or manifest
            or {"commit": "unknown", "dirty": None, "changed": [], "source": "none"})


def stamp(root: Path = ROOT) -> dict:
    """The fields a result records: its commit, and the provenance it came from."""
    p = provenance(root)
    return {"commit": p["commit"], "provenance": p}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["write"]:
        path = write_manifest()
        info = json.loads(path.read_text())
        print(f"{path}: {info['commit']}{' (dirty)' if info['dirty'] else ''}, "
              f"{len(info['files'])} files")
        return 0
    if args:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(provenance(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
