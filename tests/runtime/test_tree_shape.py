"""The tree stays one a newcomer can read: no module over 400 lines (tests and benches too), no
serving folder of more than 15 modules (`__init__` and `__main__` aside), and no loose module in
`wave_actors/` besides its `__init__` and `__main__` (each role has its folder). What it
catches: a file or a folder that grows past what one reading holds, unnoticed until a review
finds it."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("wave_actors", "gpu", "transports", "sim")
# the line bound holds for every folder of Python, the benches, the chaos suite and the tests too
ALL_PYTHON = PACKAGES + ("bench", "chaos", "tests")
MAX_LINES = 400
MAX_MODULES = 15


def _modules(folder: Path) -> list[Path]:
    return [p for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")]


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for pkg in ALL_PYTHON for p in (ROOT / pkg).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_folder_holds_more_than_15_modules():
    crowded = {str(d.relative_to(ROOT)): len(_modules(d)) for pkg in PACKAGES
               for d in [ROOT / pkg, *(ROOT / pkg).rglob("*/")] if d.is_dir()
               and len(_modules(d)) > MAX_MODULES}
    assert not crowded, f"folders of more than {MAX_MODULES} modules: {crowded}"


def test_wave_actors_has_no_loose_module():
    assert not _modules(ROOT / "wave_actors"), [p.name for p in _modules(ROOT / "wave_actors")]
