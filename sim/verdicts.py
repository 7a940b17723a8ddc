"""The verdict of `sim.validate` on one GPU result: its compared numbers (`metrics`), and
whether the sim's runs reproduce them (`compare`): p50 / p99 within TOLERANCE, open-wait p99
within TOLERANCE or one beat, and the GPU's rates of late beats and refusals inside the sim
runs' central 1 − ALPHA; with fewer than FEW_RUNS runs, where the counts say what they are a
share of, the GPU's count against the sim's pooled counts by Fisher's exact test at ALPHA.
Runs the cost model was fitted on are counted apart (`held_apart`).
The replays themselves, and the command, are `sim/validate.py`'s.
"""
from __future__ import annotations

import math

import numpy as np

TOLERANCE = 0.10         # relative difference of p50 / p99 (and open-wait p99) that still passes
ALPHA = 0.05             # a rate agrees when it lies in the sim runs' central 1 − ALPHA
OPEN_SLACK_MS = 160.0    # open waits come in whole beats: one beat's difference still passes
FEW_RUNS = 40            # fewer sim runs than this: too few to place the tails of a rate
# the rates judged: (count, what it is a share of, its name)
VERDICTS = (("late_beats", "beats", "late beats"), ("refusals", "tries", "refusals"))
METRICS = ("p50_ms", "p99_ms", "late_beats", "open_p50_ms", "open_p99_ms", "refusals")


class ValidateError(ValueError):
    """Input this tool cannot use; one line, said to the user."""


def metrics(result: dict, beats: str = "all") -> dict:
    """The compared numbers of a bench result: its worst run's p50/p99 (as the result's own
    headline), late beats and refusals over all runs, the worst run's open waits. `beats`
    "measured": p50/p99 and late beats of the measured windows (`result["measured"]`) instead
    of the headline's, for a GPU result that counted only those (`window`)."""
    runs = result.get("per_run") or []
    worst = lambda key: max((float(r.get(key, 0.0)) for r in runs), default=0.0)
    head = result
    if beats == "measured":
        head = result.get("measured")
        if not head:
            raise ValidateError("a sim result without its measured window (`measured`)")
    beats = head.get("beats_all") if beats == "all" else head.get("beats")
    return {"p50_ms": float(head["p50_ms"]), "p99_ms": float(head["p99_ms"]),
            "late_beats": int(head["late_beats"]),
            "open_p50_ms": worst("open_p50_ms"), "open_p99_ms": worst("open_p99_ms"),
            "refusals": int(sum(r.get("refusals", 0) for r in runs)),
            "beats": int(beats or sum(r.get("beats", 0) for r in runs)),
            "tries": int(sum(r.get("opens", 0) + r.get("refusals", 0) for r in runs))}


def rate(m: dict, key: str, per: str) -> float:
    """A count as a share of what it counts over (the count itself where that is unknown)."""
    return m[key] / m[per] if m.get(per) else float(m[key])


def fisher_p(a: int, n_a: int, b: int, n_b: int) -> float:
    """Two-sided p-value of Fisher's exact test that `a` of `n_a` and `b` of `n_b` come from
    one rate: the chance, given a + b events among n_a + n_b trials placed at random, of a
    split at most as likely as this one."""
    k, n = a + b, n_a + n_b

    def log_p(x: int) -> float:         # log P(x of the k events fall among the n_a)
        return (_log_comb(n_a, x) + _log_comb(n_b, k - x) - _log_comb(n, k))
    here = log_p(a)
    splits = range(max(0, k - n_b), min(k, n_a) + 1)
    return min(1.0, sum(math.exp(lp) for lp in map(log_p, splits) if lp <= here + 1e-9))


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def interval(rates: list[float]) -> tuple[float, float]:
    """The sim runs' central 1 − ALPHA of a rate; with fewer than FEW_RUNS runs, their range
    (too few runs to place the tails)."""
    if len(rates) < FEW_RUNS:
        return min(rates), max(rates)
    return (float(np.quantile(rates, ALPHA / 2, method="lower")),
            float(np.quantile(rates, 1 - ALPHA / 2, method="higher")))


def compare(gpu: dict, sim: dict | list[dict], tolerance: float = TOLERANCE,
            draws: list[dict] | None = None) -> dict:
    """Side by side, with differences (sim − GPU, ms or counts, and % of the GPU's); PASS when
    p50 and p99 are within `tolerance` and the late and refusal verdicts (any or none) agree.
    Several sim runs (seeds): their mean is compared. A verdict agrees when the GPU's answer
    is the sim's in at least ALPHA of its runs, the seeds' and `draws`' (fast-mode runs, for
    the verdicts only) together, and in one at least (module doc)."""
    sims = sim if isinstance(sim, list) else [sim]
    runs = sims + list(draws or [])
    rows = {}
    for key in METRICS:
        values = [s[key] for s in sims]
        mean = float(np.mean(values))
        diff = mean - gpu[key]
        pct = 100.0 * diff / gpu[key] if gpu[key] else (0.0 if not diff else float("inf"))
        rows[key] = {"gpu": gpu[key], "sim": round(mean, 3), "diff": round(diff, 2),
                     "diff_pct": round(pct, 1)}
        if len(sims) > 1:
            rows[key]["sim_seeds"] = values
    why = [f"{key} differs by {rows[key]['diff_pct']:+.1f} %" for key in ("p50_ms", "p99_ms")
           if not abs(rows[key]["diff_pct"]) <= 100 * tolerance]
    wait = rows["open_p99_ms"]
    if abs(wait["diff"]) > max(OPEN_SLACK_MS, tolerance * gpu["open_p99_ms"]):
        why.append(f"open_p99_ms differs by {wait['diff']:+.0f} ms ({wait['diff_pct']:+.1f} %)")
    shares = {}
    for key, per, what in VERDICTS:
        some = sum(s[key] > 0 for s in runs)
        lo, hi = interval([rate(s, key, per) for s in runs])
        got = rate(gpu, key, per)
        shares[key] = {"runs": len(runs), "with_some": some, "share": round(some / len(runs), 3),
                       "gpu_rate": round(got, 6), "sim_interval": [round(lo, 6), round(hi, 6)]}
        if len(runs) < FEW_RUNS and all(m.get(per) for m in [gpu, *runs]):
            # Too few runs for their spread to mean anything (one run's range is a point that
            # any other count misses): the counts themselves, pooled, by Fisher's exact test.
            p = fisher_p(int(gpu[key]), int(gpu[per]), int(sum(s[key] for s in runs)),
                         int(sum(s[per] for s in runs)))
            shares[key].update(test="fisher", p=round(p, 4))
            if p < ALPHA:
                why.append(f"{what}: GPU {gpu[key]} of {gpu[per]} against the sim's "
                           f"{sum(s[key] for s in runs)} of {sum(s[per] for s in runs)} "
                           f"(Fisher's exact test: p = {p:.3g} < {ALPHA})")
            continue
        shares[key]["test"] = "runs"
        if not lo <= got <= hi:
            seen = ", ".join(str(s[key]) for s in sims)
            more = f"; some in {some} of {len(runs)} runs with the draws" if draws else ""
            why.append(f"{what}: GPU {gpu[key]} (rate {got:.2e}) outside the sim's "
                       f"[{lo:.2e}, {hi:.2e}]; sim {seen}{more}")
    return {"metrics": rows, "verdicts": shares, "verdict": "FAIL" if why else "PASS",
            "why": why}


def held_apart(rows: list[dict]) -> dict:
    """Runs the cost model was fitted on and runs it never saw, counted apart: only the
    held-out ones test the model."""
    out = {}
    for name, held in (("held out", True), ("fitted on", False)):
        group = [r for r in rows if r["held_out"] == held]
        out[name] = {"files": len(group), "pass": sum(r["verdict"] == "PASS" for r in group)}
    return out
