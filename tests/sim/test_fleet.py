"""`python -m sim.fleet`: simulated nodes behind the fleet's own directory and placement."""
from __future__ import annotations

import json

import numpy as np

from sim import fleet
from sim.costmodel import CostModel

COST = CostModel.load("sim/costmodel_h200_dense.json", "dense")


def run(nodes, slots, spec, placement, seed=1):
    at, length = fleet.arrivals(spec, seed)
    return fleet.FleetRun(nodes, slots, placement, COST, 1500, seed).run(at, length)


def test_a_node_offers_only_the_slots_it_carries_on_time():
    """Bug it catches: a node offered past the count whose beat leaves the start margin."""
    n = fleet.node_slots(COST, 1500, 400)
    assert 1 <= n < 400
    assert COST.beat_time(n, 1500, 400) + float(np.median(COST.host_s)) + fleet.MARGIN_S \
        <= fleet.BEAT_S < COST.beat_time(n + 1, 1500, 400) + float(np.median(COST.host_s)) \
        + fleet.MARGIN_S


def test_below_capacity_nothing_is_blocked_or_late_and_every_call_is_accounted():
    r = run(4, 40, "poisson:rate=1,duration=300,call=60", "two_choices")    # ~60 of 160 slots
    assert r["calls"] > 200 and r["blocked"] == 0 and r["late_beats"] == 0
    assert r["open_wait_s"]["p99"] <= fleet.BEAT_S


def test_one_call_on_one_node_counts_each_of_its_beats_once():
    """Bug it catches: a beat that carried a start counted again as a plain beat."""
    at, length = np.array([0.0]), np.array([1.6])                  # ten beats long
    r = fleet.FleetRun(1, 4, "most_free", COST, 1500, 1).run(at, length)
    assert r["calls"] == 1 and r["node_beats"] == 11               # its start's beat + 10


def test_past_capacity_calls_are_blocked_not_late():
    """Bug it catches: a fleet that places past its slots (late beats) instead of refusing."""
    r = run(2, 20, "poisson:rate=2,duration=300,call=60", "most_free")       # ~120 of 40 slots
    assert r["blocking"] > 0.3 and r["late_beats"] == 0
    assert r["refusals"] == {"capacity": r["blocked"]}


def test_exact_placement_balances_better_than_random():
    spec = "poisson:rate=3,duration=600,call=60"                             # ~180 of 240 slots
    most, rand = run(8, 30, spec, "most_free"), run(8, 30, spec, "random")
    assert most["imbalance"]["p50"] < rand["imbalance"]["p50"]
    assert most["blocked"] <= rand["blocked"]


def test_the_command_writes_every_policy(tmp_path):
    out = tmp_path / "fleet.json"
    assert fleet.main(["--nodes", "3", "--slots", "20", "--workload",
                       "poisson:rate=0.5,duration=120,call=30", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert sorted(r["placement"] for r in doc["runs"]) == ["most_free", "random", "two_choices"]
    assert all(r["nodes"] == 3 and r["slots_per_node"] == 20 for r in doc["runs"])
    assert out.with_suffix(".png").stat().st_size > 0 and doc["runs"][0]["series"]
