"""The simulator prices prompt snapshots as the engine runs them: the sim executor keeps a GPU
executor's snapshot space (its book starts shared prompts by copies), a beat pays the cost
model's `copy_s` a copy and `save_s` a save in the sim executor and the fast mode alike, and
`sim.fit` fits `copy_s` from traces that count copies."""
from __future__ import annotations

import asyncio
import json
import random

import numpy as np
import pytest

from sim import fit
from sim.costmodel import (DEFAULT_PATH, SNAPSHOT_BYTES, SNAPSHOT_BYTES_PER_POSITION,
                           SNAPSHOT_COPY_S, SNAPSHOT_FIXED_BYTES, CostModel)
from sim.executor import SimExecutor, snapshot_space
from sim.fast.fast import FastConfig, _Run, run_one
from bench.harness.beat_driver import BeatDriver
from wave_actors.core.contract import ExecutorOptions, SessionSpec
from wave_actors.core.sched.start_shape import StartShape
from wave_actors.core.timebase import Clock, VirtualTimeLoop

PROMPT = "x" * 300               # 302 tokens: 19 start rows of 16 positions


def _drive(options: ExecutorOptions, opens: list[list[int]], beats: int) -> list:
    """Beats of a BeatDriver on a sim executor of `options` (virtual time); `opens[k]`: the
    slots opened with PROMPT before beat k. Every beat's plan."""
    loop = VirtualTimeLoop()
    asyncio.set_event_loop(loop)
    executor = SimExecutor(options, clock=Clock(loop))
    driver, plans = BeatDriver(executor), []

    async def body():
        for k in range(beats):
            for slot in (opens[k] if k < len(opens) else []):
                driver.open(slot, SessionSpec(PROMPT))
            plan, _ = await driver.beat()
            plans.append(plan)
    try:
        loop.run_until_complete(body())
    finally:
        executor.close()
        loop.close()
        asyncio.set_event_loop(None)
    return plans


# -- (a) a copy costs copy_s, a save save_s: in the sim executor and the fast mode alike -------

def test_a_beat_pays_copy_s_a_copy_and_save_s_a_save_in_both_modes():
    """Catches a mode that leaves copies or saves unpriced, or prices them apart from the
    other: one plan of the fast mode's book (k copies, after a save) run by both.
    The roofline model has no jitter, so a beat's time is its parts' sum exactly."""
    k = 3
    cfg = FastConfig(slots=8, lines=1, beats=1, profile="dense", warm=False)   # slot 0 saves
    run = _Run(cfg, seed=0)
    plans, book_plan = [], run.book.plan
    run.book.plan = lambda left: plans.append(book_plan(left)) or plans[-1]
    tokens = run.tokens(None)                           # the closed loop's (empty) prompt
    run.ops.append(("open", 0, tokens))
    for beat in range(3):                               # slot 0 prefills, saves, goes live
        run.beat(beat)
    run.ops += [("open", s, tokens) for s in range(1, 1 + k)]
    run.beat(3)
    saved = next(p for p in plans if p.saves)
    copied = plans[-1]
    assert len(saved.saves) == 1 and saved.rows and not saved.copies
    assert len(copied.copies) == k and copied.resets == [1, 2, 3] and not copied.rows
    assert copied.live == [0]

    cost, shape = run.cost, run.shape
    ctx = lambda p: run.offset + (float(p.context.mean()) if len(p.live) else 0.0)  # noqa: E731

    def priced(p, **extra):
        rows = len(p.rows)
        return cost.draw_beat(len(p.live), ctx(p), rows, shape.capture_for(rows),
                              shape.start_rows, random.Random(0), resets=len(p.resets),
                              rolls=len(p.roll), slots=cfg.slots, **extra)

    fast_s = run.ramp_compute                 # every beat the fast mode ran, in order
    assert len(fast_s) == len(plans)
    assert fast_s[-1] - priced(copied) == pytest.approx(k * cost.copy_s, abs=1e-12)
    i = plans.index(saved)
    assert fast_s[i] - priced(saved) == pytest.approx(cost.save_s, abs=1e-12)
    assert cost.copy_s == cost.save_s == SNAPSHOT_COPY_S > 0

    # the sim executor, handed the same plans, takes the same time for each
    loop = VirtualTimeLoop()
    sim = SimExecutor(cfg.options, cost, Clock(loop))
    inp, out = sim.alloc_input(), sim.alloc_output()
    try:
        for p, want in zip(plans, fast_s):
            sim.submit(p, inp, out)
            assert sim.collect(p, out) == want
    finally:
        sim.close()
        loop.close()


# -- (b) shared prompts start by copies: far fewer start rows ---------------------------------

def test_a_shared_prompt_is_prefilled_once_and_copied_after():
    """Catches a sim executor without the engine's snapshots (or deaf to `snapshot_mb`): 24
    sessions of one prompt, 8 opened a beat. With snapshots the first prefills its 19 rows and
    the others copy its state; without, every one prefills."""
    opens = [list(range(0, 8)), list(range(8, 16)), list(range(16, 24))]
    got = {}
    for mb in (-1.0, 0.0):
        plans = _drive(ExecutorOptions(max_sessions=24, profile="dense", snapshot_mb=mb), opens,
                       beats=60)
        got[mb] = (sum(len(p.rows) for p in plans), sum(len(p.copies) for p in plans),
                   sum(len(p.saves) for p in plans), len(plans[-1].live))
    chunks = 19                 # PROMPT's 302 tokens in rows of 16 positions
    assert got[-1.0] == (chunks, 23, 1, 24)
    assert got[0.0] == (24 * chunks, 0, 0, 24)


def test_the_fast_mode_starts_a_shared_prompt_by_copies_too():
    """Catches a fast mode whose book keeps no snapshots (its starts then not the sim
    executor's): a closed loop under churn, every line with one prompt."""
    got = {}
    for mb in (-1.0, 0.0):
        cfg = FastConfig(slots=32, lines=32, churn_s=3, beats=200, profile="dense", seed=1,
                         snapshot_mb=mb)
        res, _, run = run_one(cfg, 1)
        got[mb] = res.trace
        assert (run.snapshots is None) == (mb == 0.0)
    assert sum(got[-1.0]["resets"]) > 30 and sum(got[0.0]["resets"]) > 30
    assert sum(got[-1.0]["rows"]) == 0                      # the prompt was made in the ramp
    assert sum(got[-1.0]["copies"]) == sum(got[-1.0]["resets"])
    assert sum(got[0.0]["rows"]) > 30 and not any(got[0.0]["copies"])


def test_the_sim_keeps_the_snapshots_a_gpu_executor_keeps():
    """Catches snapshot sizes in the sim apart from the model's (the constants in
    sim/costmodel.py are computed from gpu.model; a config change must show here), a default
    snapshot memory apart from the graph executor's, and a sim that ignores `snapshot_mb`."""
    torch = pytest.importorskip("torch")
    from gpu.engine.memory_plan import SNAPSHOT_BYTES as GRAPH_DEFAULT
    from gpu.engine.snapshot_rows import space_for
    from gpu.model.config import PROFILES, VoiceChatConfig
    from gpu.model.voicechat_state import VoiceChatState
    shape = StartShape()
    for profile in ("reference", "dense"):
        state = VoiceChatState.alloc(VoiceChatConfig.full(), PROFILES[profile], 1, 16,
                                     torch.device("meta"), max_prompt=shape.max_prompt)
        for mb, capacity in ((-1.0, GRAPH_DEFAULT), (300.0, 300e6), (0.0, 0.0)):
            gpu = space_for(state, capacity, "")
            sim = SimExecutor(ExecutorOptions(max_sessions=4, profile=profile,
                                              snapshot_mb=mb)).snapshot_space
            assert (sim.entries, sim.capacity_bytes, sim.fixed_bytes,
                    sim.bytes_per_position) == (gpu.entries, gpu.capacity_bytes,
                                                gpu.fixed_bytes, gpu.bytes_per_position)
            assert (SNAPSHOT_FIXED_BYTES, SNAPSHOT_BYTES_PER_POSITION) == \
                (gpu.fixed_bytes, gpu.bytes_per_position)          # the models' defaults
    assert SNAPSHOT_BYTES == GRAPH_DEFAULT == 0.5e9           # the graph executor's default
    assert SimExecutor(ExecutorOptions(max_sessions=4)).snapshot_space.entries == 3
    fitted = CostModel.load(DEFAULT_PATH.with_name("costmodel_h200_dense.json"), "dense")
    assert snapshot_space(ExecutorOptions(max_sessions=4), fitted, shape) == \
        snapshot_space(ExecutorOptions(max_sessions=4), CostModel.load(), shape)


# -- (c) sim.fit recovers copy_s -----------------------------------------------------------------

BEAT_S, RESET_S, COPY_S, ROWS_S = 0.100, 0.0007, 0.0004, 0.020


def copies_json(path, seed=0, beats=600, copies=True, with_resets=False,
                copy_beat=0.0) -> str:
    """A GPU-like bench result whose beats cost BEAT_S + RESET_S a reset + COPY_S a copy (and
    `copy_beat` once where a beat copies) + ROWS_S with start rows (±0.05 ms noise). A beat
    opens 0–4 sessions; each copies unless it is a prompt's first (`with_resets`: every opened
    one copies: copies = resets); `copies` False: the trace has no `copies` column (as results
    from before snapshots)."""
    rng = np.random.default_rng(seed)
    resets = rng.integers(0, 5, beats) * (rng.random(beats) < 0.4)
    n_copies = resets if with_resets else np.minimum(resets, rng.integers(0, 5, beats))
    rows = np.where(rng.random(beats) < 0.1, 16, 0)
    compute = (BEAT_S + RESET_S * resets + COPY_S * n_copies + ROWS_S * (rows > 0)
               + copy_beat * (n_copies > 0) + 5e-5 * rng.standard_normal(beats))
    ms = lambda xs: [round(1e3 * float(x), 4) for x in xs]  # noqa: E731
    trace = {"latency_ms": ms(compute + 0.002), "compute_ms": ms(compute),
             "gc_ms": [0.0] * beats, "sessions": [100] * beats, "rows": rows.tolist(),
             "resets": resets.tolist(), "rolls": [0] * beats}
    if copies:
        trace["copies"] = n_copies.tolist()
    run = {"sessions": 100, "beats": beats, "late_beats": 0, "p50_ms": 102.0, "p99_ms": 125.0,
           "refusals": 0, "compute_p50_ms": 100.0, "trace": trace}
    doc = {"backend": "graph", "profile": "dense", "context": 1500, "sessions": 100, "runs": 1,
           "beats": beats, "late_beats": 0, "p50_ms": 102.0, "p99_ms": 125.0, "virtual": False,
           "gpu": "NVIDIA H200", "commit": "abc1234",
           "command": "python -m wave_actors.bench --backend graph --profile dense",
           "per_run": [run], "extra": {"engine": {"buckets_captured": [100]}}}
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_fit_recovers_a_planted_copy_s(tmp_path):
    """Catches a fit that drops the traces' `copies` (copy_s left at the prior, its cost
    put on the resets) or mixes it into another part."""
    doc = fit.build([fit.read(copies_json(tmp_path / f"c{i}.json", seed=i)) for i in range(2)])
    assert doc["copy_s"] == pytest.approx(COPY_S, abs=2e-5)
    assert doc["reset_s"] == pytest.approx(RESET_S, abs=2e-5)
    assert doc["start_rows_s"] == pytest.approx(ROWS_S, abs=5e-5)
    assert doc["_fit"]["start_rows"]["added_ms"]["copy_s"] == pytest.approx(1e3 * COPY_S,
                                                                            abs=0.02)
    model = fit.model_of(doc)
    assert model.copy_s == doc["copy_s"]
    assert model.save_s == SNAPSHOT_COPY_S                  # no trace counts saves: the prior
    assert doc.get("copy_beat_s", 0.0) == pytest.approx(0.0, abs=2e-5)


def test_the_fit_recovers_a_planted_cost_of_a_beat_that_copies(tmp_path):
    """Catches a fit (or a model) without the once-a-beat part of copies the H200 showed at
    300 slots (~6 ms with the first copy, ~0.5 with each more): its cost then lands on
    copy_s, far too dear for a beat of many copies and too cheap for a beat of one."""
    doc = fit.build([fit.read(copies_json(tmp_path / f"c{i}.json", seed=i, copy_beat=0.006))
                     for i in range(2)])
    assert doc["copy_beat_s"] == pytest.approx(0.006, abs=5e-5)
    assert doc["copy_s"] == pytest.approx(COPY_S, abs=2e-5)
    assert doc["reset_s"] == pytest.approx(RESET_S, abs=2e-5)
    model = fit.model_of(doc)
    parts = lambda copies: model.draw_parts(100, 1500, 0, 0, 16, random.Random(0),  # noqa: E731
                                            resets=copies, copies=copies)[0]
    assert parts(1) - parts(0) == pytest.approx(RESET_S + COPY_S + 0.006, abs=1e-4)
    assert parts(5) - parts(1) == pytest.approx(4 * (RESET_S + COPY_S), abs=1e-4)


@pytest.mark.parametrize("kwargs", [{"copies": False}, {"with_resets": True}],
                         ids=["no copies column", "copies never apart from resets"])
def test_the_fit_keeps_the_prior_copy_s_where_the_beats_cannot_tell_it(tmp_path, kwargs):
    """Catches a fit that invents copy_s from traces without copies (or with copies only ever
    as many as the beat's resets, where their costs cannot be told apart)."""
    doc = fit.build([fit.read(copies_json(tmp_path / "c.json", **kwargs))])
    assert doc["copy_s"] == json.loads(DEFAULT_PATH.read_text())["copy_s"] == SNAPSHOT_COPY_S
    assert "copy_s" in doc["_fit"]["start_rows"]["not_told"]
    if kwargs.get("with_resets"):         # a reset's beat pays for its copy: one part for both
        assert doc["reset_s"] == pytest.approx(RESET_S + COPY_S, abs=2e-5)
