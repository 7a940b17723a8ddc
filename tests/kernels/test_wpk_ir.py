"""The stage IR (issue 18, stage 2) on the CPU: a traced stage replayed equals the stage run (so no
op is missing and every argument is wired as traced); a batch made symbolic from two traces gives
the shapes a third trace has, and a symbolic IR replayed at a batch it was never traced at
equals the stage run there; storage classes are right; the memory plan never lets two live
storages share bytes."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from gpu.wpk import memplan
from gpu.wpk.ir import Dim, Storage, _fit, at, replay, symbolic, trace
from gpu.wpk.stages import perception_ir, perception_stage


def _state_of(run):
    return {k: t.clone() for k, t in run.tensors().items() if k.startswith("state:")}


def test_a_traced_stage_replayed_equals_the_stage_run():
    """Catches an op the trace missed or an argument wired to the wrong tensor: the replay
    would differ from the run (outputs or the slot state it writes)."""
    traced = perception_stage("tiny", "fp32", 3, device="cpu")
    graph = trace(traced.fn, traced.named)
    direct = perception_stage("tiny", "fp32", 3, device="cpu")
    expect = direct.fn()
    fresh = perception_stage("tiny", "fp32", 3, device="cpu")
    got = replay(graph, fresh.tensors())
    for a, b in zip(got, expect):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for k, t in _state_of(direct).items():
        torch.testing.assert_close(fresh.tensors()[k], t, rtol=0, atol=0, msg=k)


def test_a_symbolic_batch_gives_a_third_traces_shapes_and_runs_at_an_untraced_batch():
    g = perception_ir("tiny", "fp32", 2, 3)
    third = trace(**vars(perception_stage("tiny", "fp32", 5)))
    assert [n.op for n in g.nodes] == [n.op for n in third.nodes]
    for v, w in zip(g.values, third.values):
        assert at(v.shape, 5) == w.shape
    for s, t in zip(g.storages, third.storages):
        assert at(s.nbytes, 5) == t.nbytes
    assert any(isinstance(d, Dim) and d.per_b for v in g.values for d in v.shape)
    run = perception_stage("tiny", "fp32", 4, device="cpu")
    expect = perception_stage("tiny", "fp32", 4, device="cpu").fn()
    got = replay(g, run.tensors(), batch=4)
    for a, b in zip(got, expect):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_storage_classes_and_what_the_stage_writes():
    """Weights are never written; the slot state is (the ring of keys and values, the time
    cache, the frame counters); every output is a storage of its own class."""
    g = perception_ir("tiny", "fp32")
    names = {g.values[v].storage: k for k, v in g.named.items()}
    for sid in g.storages_of(Storage.WEIGHT):
        assert names[sid].startswith("weight:")
    written = set().union(*(n.writes for n in g.nodes))
    assert not written & set(g.storages_of(Storage.WEIGHT))
    state_written = {names[s] for s in written & set(g.storages_of(Storage.STATE))}
    assert state_written == {"state:k", "state:v", "state:time", "state:frames"}
    assert {g.storages[g.values[v].storage].kind for v in g.outputs} == {Storage.OUTPUT}


def test_a_batch_dependent_op_sequence_or_fraction_is_refused():
    def stage(b):
        x = torch.zeros(b, 4, device="meta")
        return (lambda: x.sum(0) if b < 3 else x.mean(0)), {"input:x": (Storage.INPUT, x)}
    g2 = trace(*stage(2))
    g4 = trace(*stage(4))
    with pytest.raises(ValueError, match="ops change with the batch"):
        symbolic(g2, 2, g4, 4)
    with pytest.raises(ValueError, match="not an integer"):
        _fit(3, 4, 2, 4, "x")
    assert _fit(6, 10, 2, 4, "x") == Dim(2, 2)


@st.composite
def _blocks(draw):
    n = draw(st.integers(1, 30))
    out = []
    for i in range(n):
        first = draw(st.integers(0, 40))
        out.append(memplan.Block(i, draw(st.integers(1, 8)) * memplan.ALIGN, first,
                                 first + draw(st.integers(0, 15))))
    return out


@settings(max_examples=200, deadline=None)
@given(_blocks())
def test_the_placement_never_shares_bytes_between_live_storages(blocks):
    """Catches a placement that ignores a lifetime (two live tensors in the same bytes) or an
    arena smaller than what is live at once."""
    p = memplan.place(blocks)
    assert memplan.check(p) == []
    assert memplan.peak(blocks) <= p.arena <= sum(b.size for b in blocks)


def test_the_check_finds_a_planted_overlap_and_the_perception_plan_is_sound():
    blocks = [memplan.Block(0, 512, 0, 5), memplan.Block(1, 512, 3, 8)]
    bad = memplan.Plan(blocks, {0: 0, 1: 256}, 768)
    assert any("live together" in p for p in memplan.check(bad))
    g = perception_ir("tiny", "fp32")
    for batch in (1, 7, 120):
        blocks = memplan.lifetimes(g, batch)
        p = memplan.place(blocks)
        assert memplan.check(p) == []
        assert p.arena < sum(b.size for b in blocks)    # lifetimes let storages share bytes
