"""`python bench/results_md.py [--check]`: write bench/RESULTS.md from the files in bench/results/.

    python bench/results_md.py            # rewrite bench/RESULTS.md
    python bench/results_md.py --check    # exit 1 if bench/RESULTS.md is not what this writes

Every file under bench/results/ is sorted into a kind by its keys (chaos: `chaos` or a name
`chaos-*`; bench: `backend` and `per_run`; stages: `stage_ms`; checks: rows with `text_equal`;
kernel A/Bs: `rows` or `variants`; else "other", a row naming the program that wrote it) and tabled,
newest first (`date`, else the file name's stamp). Tables only: what a run showed is said where
it is used; superseded runs live in git history. No generation date: `--check` is byte exact.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from results_cells import (bench_args, code, first_frame, link, live_range, num, per_run,
                           scalar, short_date, table)

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
OUT = BENCH / "RESULTS.md"
STAMP = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})")
ROWS_SHOWN = 10             # a kernel A/B or check's own rows are tabled up to this many

SECTIONS = (                # kind -> heading; bench runs of other backends follow "sim"
    ("graph", "Capacity bench on the graph backend "
              "(`python -m wave_actors.bench --backend graph`)"),
    ("sim", "Simulator runs (`--backend sim` or `python -m sim.run`: GPU time modelled)"),
    ("stages", "Stage timings (`bench/graph_stages.py`)"),
    ("kernels", "Kernel A/Bs and sweeps (what each showed: `docs/FINDINGS.md`)"),
    ("checks", "Parity and checks (`bench/graph_check.py`)"),
    ("fidelity", "Teacher-forced fidelity per stage (`bench/fidelity.py`)"),
    ("chaos", "Chaos runs (`python -m chaos.run`, `make chaos`: fuzzers against the node and "
              "bridges while victim sessions stream; crashes, sessions lost and frames "
              "unaccounted must be 0, a soak's RSS growth ≤ 20 MB)"),
    ("latency", "Input latency on virtual time (`python -m sim.latency`: the real node, a 1.2 s "
                "stall then its backlog at once, and 10 % message loss)"),
    ("other", "Other files"),
)

def load(path: Path) -> object:
    """The file's JSON, or None where it is not JSON."""
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        return None


def kind_of(data: object, name: str = "") -> str:
    if not isinstance(data, dict):
        return "other"
    if isinstance(data.get("chaos"), dict) or name.startswith("chaos-"):
        return "chaos"
    if isinstance(data.get("latency"), dict):
        return "latency"
    command = str(data.get("command", ""))
    rows = data.get("rows") if isinstance(data.get("rows"), list) else data.get("variants")
    if "backend" in data and isinstance(data.get("per_run"), list):
        return str(data["backend"])
    if isinstance(data.get("quantities"), dict) and "reference_profile" in data:
        return "fidelity"
    if "stage_ms" in data or "graph_stages" in command:
        return "stages"
    if "graph_check" in command or (isinstance(rows, list) and rows and isinstance(rows[0], dict)
                                    and "text_equal" in rows[0]):
        return "checks"
    if isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
        return "kernels"
    return "other"


def date_of(name: str, data: object) -> str:
    """ISO date of the run: its `date` field, else the stamp in its name, else ''."""
    if isinstance(data, dict) and isinstance(data.get("date"), str):
        return data["date"]
    m = STAMP.search(name)
    return "{}-{}-{}T{}:{}:{}".format(*m.groups()) if m else ""


def bench_row(name: str, date: str, d: dict) -> list:
    runs = [r for r in d.get("per_run", []) if isinstance(r, dict)]
    beats = d.get("beats", "?")
    late = sum(r.get("late_beats", 0) for r in runs)
    total = sum(r.get("beats", 0) for r in runs)
    shape = f"{len(runs)} × {beats}"
    if "runs_requested" in d:
        shape += f" (of {d['runs_requested']})"
    extra = d.get("extra") if isinstance(d.get("extra"), dict) else {}
    ceiling = extra.get("memory_ceiling_sessions", d.get("memory_ceiling_sessions", "—"))
    opens = [r for r in runs if "open_p50_ms" in r]
    waits = " / ".join(f"{r['open_p50_ms'] / 1e3:.1f} / {r['open_p99_ms'] / 1e3:.1f}"
                       for r in opens) if opens else "—"
    refused = sum(r.get("refusals", 0) for r in runs)
    sessions = d.get("sessions", "—")
    bursts = [r["burst"] for r in runs if r.get("burst")]
    if bursts:                     # --burst: callers dialled onto the steady node, apart
        sessions = f"{sessions} + {bursts[0]['sessions']} burst"
        waits += "; burst " + " / ".join(
            f"{b['open_p50_ms'] / 1e3:.1f} / {b['open_p99_ms'] / 1e3:.1f}" if b["opened"]
            else "none opened" for b in bursts)
        refused += sum(b["refused"] for b in bursts)
    profile = d.get("profile", "—")
    if d.get("gpu") and "H200" not in d["gpu"]:        # the table is the H200's unless named
        profile += f" ({d['gpu'].replace('NVIDIA ', '').split()[0]})"
    return [short_date(date), link(name), d.get("commit", "—"), profile,
            sessions, shape, f"{late} of {total}", per_run(d, "p50_ms"),
            per_run(d, "p99_ms"), first_frame(runs), per_run(d, "compute_p99_ms"), live_range(runs), waits, refused, ceiling,
            code(bench_args(d["command"], SHOWN)) if "command" in d else "—"]


SHOWN = ("--out", "--profile", "--sessions", "--beats", "--runs")    # the row's columns say these
BENCH_HEAD = ["date (UTC)", "JSON", "commit", "profile", "sessions", "runs × beats", "late",
              "p50 ms (per run)", "p99 ms (per run)", "first frame p50 / p99 ms",
              "backend p99 ms",
              "live min / median / max", "open wait p50 / p99 s", "refused", "memory ceiling",
              "other arguments"]


def stage_fit(pair: object) -> str:
    if isinstance(pair, list) and len(pair) == 2:
        return f"{pair[0]:g} + {pair[1]:g}·N"
    return "—"


def stage_row(name: str, date: str, d: dict) -> list:
    beat = d.get("fit_beat") or {}
    return [link(name), d.get("commit", "—"), d.get("profile", "—"),
            ", ".join(str(s) for s in d.get("sessions", [])), stage_fit(d.get("fit_frame")),
            stage_fit(beat.get("beat one stream")), stage_fit(beat.get("beat streams")),
            code(d["command"]) if "command" in d else "—"]


def stage_detail(name: str, d: dict) -> list:
    """Per stage: the fit's fixed and per-session ms a frame, and the time at the largest N."""
    fits = d.get("fit_fixed_ms_per_session_ms")
    if not isinstance(fits, dict):
        return []
    stage_ms = d.get("stage_ms") or {}
    big = max(stage_ms, key=lambda s: int(s) if s.isdigit() else 0) if stage_ms else None
    body = [[stage, num(f[0], "{:.3g}"), num(f[1], "{:.3g}"),
             num(stage_ms[big].get(stage), "{:.2f}") if big else "—"]
            for stage, f in sorted(fits.items())]
    head = ["stage", "fixed ms", "ms per session", f"ms at {big} sessions"]
    return ["", f"Per stage, one frame ({name}):", ""] + table(head, body)


def rows_table(rows: list) -> list:
    """A file's own rows as a table, when they are few and flat."""
    if not rows or len(rows) > ROWS_SHOWN or not all(isinstance(r, dict) for r in rows):
        return []
    if any(isinstance(v, (dict, list)) for r in rows for v in r.values()):
        return []
    head = list(dict.fromkeys(k for r in rows for k in r))
    return table(head, [[scalar(r.get(k, "")) for k in head] for r in rows])


def own_rows(d: dict) -> list:
    return d["rows"] if isinstance(d.get("rows"), list) else d.get("variants", [])


def listed_row(name: str, date: str, d: dict) -> list:
    return [short_date(date), link(name), d.get("commit", "—"), d.get("gpu", "—"),
            len(own_rows(d)), code(d["command"]) if "command" in d else "—"]


def listed_detail(name: str, d: dict) -> list:
    shown = rows_table(own_rows(d))
    return ["", f"{name}:", ""] + shown if shown else []


def other_row(name: str, date: str, d: object) -> list:
    """The file and the program that wrote it (its command's first word past `python [-m]`)."""
    if isinstance(d, dict) and isinstance(d.get("command"), str):
        words = [w for w in d["command"].split() if w != "-m" and not w.startswith("python")]
        what = code("python -c" if words[0] == "-c" else words[0]) if words else "—"
    else:
        what = "not JSON" if d is None else "—"
    return [short_date(date), link(name), what]


LISTED_HEAD = ["date (UTC)", "JSON", "commit", "device", "rows", "command"]
STAGES_HEAD = ["JSON", "commit", "profile", "sessions", "frame fit ms",
               "beat fit ms, one stream", "beat fit ms, five streams", "command"]
OTHER_HEAD = ["date (UTC)", "file", "written by"]
FIDELITY_HEAD = ["JSON", "commit", "profile vs", "config", "sessions × frames", "device",
                 "command"]


def fidelity_row(name: str, date: str, d: dict) -> list:
    return [link(name), d.get("commit", "—"), f"{d['profile']} vs {d['reference_profile']}",
            d["config"], f"{d['sessions']} × {d['frames']}" + (
                f" (of {d['frames_asked']} asked)"
                if d.get("frames_asked", d["frames"]) != d["frames"] else ""),
            d.get("device_name", "—"),
            code(d["command"]) if "command" in d else "—"]


def fidelity_detail(name: str, d: dict) -> list:
    """Per quantity: its precision, max and L2 relative error, and top-1 agreement where the
    reference's margin exceeds the precision's bound (counted: the share of rows that did)."""
    rows = [["quantity", "precision", "rel_max", "rel_l2", "counted", "top-1 agree"],
            ["---"] * 6]
    same = [q for q, v in d["quantities"].items() if v.get("rel_max") == 0.0]
    for q, v in d["quantities"].items():
        if q in same:
            continue
        prec = d.get("stage_precision", {}).get(v.get("stage", q.split(".")[0]), "—")
        top1 = v.get("top1") or {}
        rows.append([q, prec, num(v.get("rel_max"), "{:.2e}"), num(v.get("rel_l2"), "{:.2e}"),
                     num(top1["counted"], "{:.3f}") if "counted" in top1 else "",
                     num(top1["agree"], "{:.4f}") if "agree" in top1 else ""])
    tail = [f"Identical to the reference: {', '.join(same)}."] if same else []
    kls: dict[str, list[str]] = {}         # one line for the distributions with the same figures
    for k, v in d.get("kl", {}).items():
        if v.get("max"):
            kls.setdefault(f"mean {v['mean']:.2e}, max {v['max']:.2e} nats", []).append(k)
    tail += [f"KL (reference ‖ tested), {', '.join(ks)}: {fig}." for fig, ks in kls.items()]
    return (["", f"{name}:", ""] + ["| " + " | ".join(map(str, r)) + " |" for r in rows]
            + ([""] + tail if tail else []))


CHAOS_HEAD = ["date (UTC)", "JSON", "commit", "mode", "seed", "messages tried",
              "errors answered", "crashes", "sessions lost", "frames unaccounted",
              "RSS growth MB", "result", "command"]
CHAOS_FIGURES = ("messages_tried", "errors_answered", "crashes", "sessions_lost",
                 "frames_unaccounted")


def chaos_row(name: str, date: str, d: dict) -> list:
    c = d["chaos"] if isinstance(d.get("chaos"), dict) else d
    figs = [c[k] for k in CHAOS_FIGURES]
    # `ok` where the run judged itself (out of order, failed rounds, a soak's memory too)
    result = "pass" if c.get("ok", not any(figs[2:])) else "FAIL"
    grew = c.get("rss_growth_mb")
    return [short_date(date), link(name), d.get("commit", "—"), c.get("mode", "—"),
            c.get("seed", "—"), *figs, "—" if grew is None else grew, result,
            code(d["command"]) if "command" in d else "—"]


def chaos_detail(name: str, d: dict) -> list:
    """Per victim of a soak: frames sent, heard, dropped, unaccounted, and why it was lost, if
    it was (the shorter runs' victims are in their JSON)."""
    c = d["chaos"] if isinstance(d.get("chaos"), dict) else d
    victims = [v for v in d.get("victims", []) if isinstance(v, dict)]
    if not victims or c.get("mode") != "soak":
        return []
    rows = []
    for v in victims:
        st = v.get("stats") if isinstance(v.get("stats"), dict) else {}
        rows.append([v.get("name", "?"), "relay" if v.get("relayed") else "direct",
                     v.get("sent", "—"), st.get("frames_in", "—"),
                     st.get("dropped_in", st.get("dropped", "—")), v.get("unaccounted", "—"),
                     v.get("lost") or "—"])
    head = ["victim", "via", "frames sent", "heard", "dropped (in)", "unaccounted", "lost"]
    return ["", f"Victims ({name}):", ""] + table(head, rows)


LATENCY_HEAD = ["date (UTC)", "JSON", "commit", "jitter buffer", "baseline ms",
                "5 s after the stall ms", "stall excess ms (target ≤ 40)",
                "10 % loss excess ms (target ≤ 100)", "command"]


def latency_rows(name: str, date: str, d: dict) -> list:
    return [[short_date(date), link(name), d.get("commit", "—"), buffer, r["baseline_ms"],
             r["after_stall_ms"], r["stall_excess_ms"], r["loss10_excess_ms"],
             code(d["command"]) if "command" in d else "—"]
            for buffer, r in d["latency"].items()]


def latency_row(name: str, date: str, d: dict) -> list:
    return latency_rows(name, date, d)[0]


def latency_detail(name: str, d: dict) -> list:
    """The other buffers of the same file (the table's row shows the first)."""
    rest = latency_rows(name, "", d)[1:]
    return ["", f"Compared in {name}:", ""] + table(LATENCY_HEAD, rest) if rest else []


def shape_of(kind: str) -> tuple:
    """(header, row builder, detail builder) for a kind; bench runs of any backend share one."""
    if kind == "latency":
        return LATENCY_HEAD, latency_row, latency_detail
    if kind == "chaos":
        return CHAOS_HEAD, chaos_row, chaos_detail
    if kind == "stages":
        return STAGES_HEAD, stage_row, stage_detail
    if kind in ("kernels", "checks"):
        return LISTED_HEAD, listed_row, listed_detail
    if kind == "fidelity":
        return FIDELITY_HEAD, fidelity_row, fidelity_detail
    if kind == "other":
        return OTHER_HEAD, other_row, lambda name, d: []
    return BENCH_HEAD, bench_row, lambda name, d: []


def entry(path: Path) -> tuple:
    """(kind, name, data, date, row, detail): a schema that surprises its kind's renderer
    falls back to the generic row instead of failing the whole file."""
    data = load(path) if path.suffix == ".json" else None
    name = path.name
    kind = kind_of(data, name)
    date = date_of(name, data)
    _, row, detail = shape_of(kind)
    try:
        return kind, name, data, date, row(name, date, data), detail(name, data)
    except (TypeError, KeyError, ValueError, AttributeError, IndexError):
        return "other", name, data, date, other_row(name, date, data), []


HEADER = ("Generated by `python bench/results_md.py` from `bench/results/`; do not edit by hand "
          "(`python bench/results_md.py --check` fails when this file is stale). Rows are newest "
          "first; each names its JSON file, the commit it was measured at and the command that "
          "made it, as the file records them. Capacity rows are the H200's unless the profile names another card. Latency is at the server boundary, from beat "
          "release to outputs routed; a beat is late past 160 ms.")


def render(results: Path) -> str:
    groups: dict = {}
    for path in sorted(p for p in results.iterdir() if p.is_file()):
        e = entry(path)
        groups.setdefault(e[0], []).append(e)
    titles = dict(SECTIONS)
    backends = sorted(k for k in groups if k not in titles)
    order = [("graph", titles["graph"]), ("sim", titles["sim"])]
    order += [(b, f"Bench runs on the `{b}` backend") for b in backends]
    order += [s for s in SECTIONS if s[0] not in ("graph", "sim")]
    out = ["# Measurements", "", HEADER]
    for kind, heading in order:
        group = sorted(groups.get(kind, []), key=lambda e: e[1])
        group = sorted(group, key=lambda e: e[3], reverse=True)   # newest first, ties by name
        if not group:
            continue
        head = shape_of(kind)[0]
        out += ["", f"## {heading}", ""]
        if kind == "stages":
            out += ["Fits are ms for N sessions (least squares over the measured N).", ""]
        out += table(head, [e[4] for e in group], drop_empty=head is BENCH_HEAD)
        out += [line for e in group for line in e[5]]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/results_md.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if the output file is stale")
    ap.add_argument("--results", default=str(RESULTS), help="folder of result files")
    ap.add_argument("--out", default=str(OUT), help="the Markdown file to write or check")
    args = ap.parse_args(argv)
    text = render(Path(args.results))
    out = Path(args.out)
    if args.check:
        if not out.exists() or out.read_text() != text:
            print(f"{out} is stale: run python bench/results_md.py", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
