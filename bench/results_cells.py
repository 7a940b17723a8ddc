"""The cells of bench/RESULTS.md's tables: how a figure, a command, a date or a run's numbers
print (`results_md.py` lays the tables out)."""
from __future__ import annotations

import json
import statistics


def cell(text: object) -> str:
    return str(text).replace("\n", " ").replace("|", "\\|")


def code(text: object) -> str:
    """A code span; a table's cell() escapes its pipes later (GFM wants \\| inside spans too).
    A device wrapper's shell line shows only the Python commands it ran (its pipes, tees and
    environment are the wrapper's, not the measurement's)."""
    s = str(text).replace("\n", " ")
    if ";" in s and "python" in s:
        runs = [part.split("|")[0].strip() for part in s.split(";")]
        runs = [r[r.index("python"):] for r in runs if "python" in r]
        s = "; ".join(r.split(" 2>")[0] for r in runs)
    return f"`` {s} ``" if "`" in s else f"`{s}`"


def bench_args(command: str, shown: tuple[str, ...] = ("--out",)) -> str:
    """A bench command less what its table's heading says (`python -m wave_actors.bench
    --backend graph`), its `--out` folder (a path on the machine it ran on) and any other option
    in `shown` (one its row has a column for)."""
    words = str(command).split()
    drop = {i for i, w in enumerate(words) if w in shown}
    words = [w for i, w in enumerate(words) if i not in drop and i - 1 not in drop]
    text = " ".join(words)
    for head in ("python -m wave_actors.bench --backend graph", "python -m wave_actors.bench"):
        if text.startswith(head):
            return text[len(head):].strip() or "(defaults)"
    return text


def link(name: str) -> str:
    return f"[{name.removesuffix('.json')}](results/{name})"


def short_date(iso: str) -> str:
    return iso[:16].replace("T", " ") if iso else "—"


def num(v: object, fmt: str = "{:.1f}") -> str:
    return fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else "—"


def scalar(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, separators=(",", ":"))
    return str(v)


def table(head: list, rows: list, drop_empty: bool = False) -> list:
    """A Markdown table; with drop_empty, columns that are "—" in every row are left out."""
    if drop_empty and rows:
        keep = [i for i in range(len(head)) if any(str(r[i]) != "—" for r in rows)]
        head, rows = [head[i] for i in keep], [[r[i] for i in keep] for r in rows]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]


def per_run(data: dict, key: str) -> str:
    vals = [num(r.get(key)) for r in data.get("per_run", []) if isinstance(r, dict)]
    return " / ".join(vals) if any(v != "—" for v in vals) else "—"


def first_frame(runs: list) -> str:
    """Release → a beat's first frame routed, p50 / p99 per run, where it came ahead of the
    beat (an executor that routes frame 0 while frame 1 computes)."""
    got = [r["first_frame"] for r in runs
           if r.get("first_frame") and r["first_frame"]["p99"] < r.get("p99_ms", 0)]
    return ", ".join(f"{f['p50']:.1f} / {f['p99']:.1f}" for f in got) or "—"


def live_range(runs: list) -> str:
    """min / median / max live sessions over the measured beats, where the trace has them."""
    live = [n for r in runs for n in (r.get("trace") or {}).get("sessions", [])]
    if not live:
        return "—"
    return f"{min(live)} / {statistics.median(live):g} / {max(live)}"
