"""A stage traced from the model, compiled, lowered onto the task ops (`gpu/wpk/lower.py`) and
run as one task-table program on the threaded interpreter, against the model's own modules.

Bugs these catch: a value placed away from where its memory plan (or the weight arena) puts
it, a record whose words are out of order, an epilogue's SiLU or scale dropped or applied in the
wrong order, an add's residual or alpha lost, tiles counted for the wrong tile shape (a wait
that never ends, or one that ends early), split-K partials summed short, and a stage the
task ops cannot run lowered anyway instead of refused with the kernel named."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from gpu.model.perception import ConformerLayer, PerceptionConfig
from gpu.wpk import taskrun as T
from gpu.wpk.ir import Storage, trace
from gpu.wpk import lower as L
from gpu.wpk.compile import compile_stage
from gpu.wpk.lower import Unsupported, lower
from gpu.wpk.stages import _traceable, feed_forward_halves, feed_forward_stage, perception_stage
from gpu.wpk.sync import interp
from gpu.wpk.testing import threaded
from gpu.wpk.tilecounters import TileBlocks

pytestmark = pytest.mark.skipif(not interp(), reason="the interpreter's threaded runs")


def _layer(bias: bool) -> tuple[ConformerLayer, PerceptionConfig]:
    cfg = dataclasses.replace(PerceptionConfig.tiny(), use_bias=bias)
    torch.manual_seed(3)
    layer = ConformerLayer(cfg)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn(p.shape) * 0.2)    # not the identity norm, nor zero biases
    return layer, cfg


def _traced(layer, x, fn):
    named = {"x": (Storage.INPUT, x)}
    named.update({n: (Storage.WEIGHT, p.detach()) for n, p in layer.named_parameters()})
    return trace(lambda: fn(layer, x), named), {k: t for k, (_, t) in named.items()}


@pytest.mark.parametrize("bias,rows,programs", [(False, (6,), 3), (True, (5,), 4),
                                                (False, (20,), 1), (False, (3, 2), 3)])
def test_the_lowered_feed_forward_halves_compute_what_the_model_does(bias, rows, programs):
    """Rows as [B, D], or as perception has them, [B, F, D] (a beat's frames per session)."""
    layer, cfg = _layer(bias)
    x = torch.randn(*rows, cfg.d_model, generator=torch.Generator().manual_seed(rows[0]))
    graph, tensors = _traced(layer, x, feed_forward_halves)
    low = lower(graph, rows[0], programs)
    # the second GEMM of each half-step (K = 4 × d, one tile) is split when programs are idle
    assert any(r[9] > 1 for r in low.args) == (programs > 1)
    assert [k.name for k in low.compiled.kernels] == ["layer_norm", "gemm", "gemm",
                                                      "add_layer_norm"] * 2
    rows_t, starts = (torch.from_numpy(a) for a in low.table.emit())
    args = torch.from_numpy(low.args)
    counters = torch.zeros(low.table.n_counters, dtype=torch.int32)
    with torch.no_grad():
        want = feed_forward_halves(layer, x)
    for beat in (1, 2):
        arena, weights = low.load(tensors)
        threaded(T.task_program, (programs,), rows_t, starts, counters, arena, weights, args,
                 beat, 0, TILE=16, BLOCK_N=16, IS_INTERP=True, timeout_s=240)
        for got, ref in zip(low.outputs(arena), want):
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_kernels_without_a_task_op_are_refused_by_name():
    layer, cfg = _layer(False)
    x = torch.randn(4, cfg.d_model)

    def softmax_down(layer, x):
        return torch.softmax(layer.feed_forward1.linear1(x), 0)

    def to_integers(layer, x):
        return layer.feed_forward1.linear1(x).long()

    def sorted_(layer, x):
        return torch.sort(layer.feed_forward1.linear1(x), -1).values

    def odd_scale(layer, x):
        return layer.feed_forward1.linear1(x) * 0.1

    for fn, says in ((softmax_down, "not over dense rows"), (to_integers, "_to_copy from"),
                     (sorted_, "sort has no task op"), (odd_scale, r"multiple of 2\^-16")):
        graph, _ = _traced(layer, x, fn)
        with pytest.raises(Unsupported, match=says):
            lower(graph, 4, 2)


def test_a_perception_stack_lowers_with_bf16_weights_and_stays_close_to_fp32():
    """The stage the device bench lowers (`feed_forward_stage`, the model's own layers chained),
    at the tiny config with its weights held in bf16: every layer's tiles wait for the layer
    before across the whole stack, and the result stays within bf16's error of the fp32 model
    (a GEMM fed fp32 bits as bf16, or a weight cast wrongly, is far off)."""
    run = feed_forward_stage("tiny", rows=7)
    graph = trace(run.fn, run.named)
    low = lower(graph, 7, 3, weight_dtype=torch.bfloat16)
    assert low.wdtype == torch.bfloat16
    gemm_weights = sum(t.numel() for n, t in run.tensors().items()
                       if ".feed_forward" in n and ".linear" in n)
    assert gemm_weights <= low.weights < gemm_weights + T.ALIGN * 8   # each once, aligned
    rows_t, starts = (torch.from_numpy(a) for a in low.table.emit())
    counters = torch.zeros(low.table.n_counters, dtype=torch.int32)
    arena, weights = low.load(run.tensors())
    threaded(T.task_program, (3,), rows_t, starts, counters, arena, weights,
             torch.from_numpy(low.args), 1, 0, TILE=16, BLOCK_N=16, IS_INTERP=True,
             timeout_s=240)
    with torch.no_grad():
        want = run.fn()
    for got, ref in zip(low.outputs(arena), want):
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        assert 1e-6 < err < 2e-2, err       # bf16's rounding, and no more


def _split_regions(graph, programs: int, unordered: tuple = ()) -> list:
    """The partial regions `_split_k` gives the split GEMMs, after dropping the edges of
    `unordered` kernels (making them independent of everything before them)."""
    graph = L.fp32_arena(graph)
    compiled = compile_stage(graph, 6, programs)
    for i in unordered:
        compiled.kernels[i].after = set()
    low = L.lower_compiled(graph, compiled, programs)
    return [r[3] for r, op in zip(low.args, low.ops) if op == T.GEMM and r[9] > 1]


def test_split_k_partials_are_shared_only_by_gemms_ordered_after_their_readers():
    """Two feed-forward branches from one input: run, they equal the model. Their split GEMMs
    share one partial region only because the memory plan orders the second branch after the
    first; with that edge dropped (the branches independent) each gets its own, and a chain
    of half-steps reuses one. Catches a region reused while another GEMM's partials may be
    unread (a race a run may not show), and regions never reused."""
    layer, cfg = _layer(False)
    x = torch.randn(6, cfg.d_model, generator=torch.Generator().manual_seed(5))

    def branches(layer, x):
        a = layer.norm_self_att(x + 0.5 * layer.feed_forward1(layer.norm_feed_forward1(x)))
        b = layer.norm_out(x + 0.5 * layer.feed_forward2(layer.norm_feed_forward2(x)))
        return a, b

    graph, tensors = _traced(layer, x, branches)
    low = lower(graph, 6, 3)
    rows_t, starts = (torch.from_numpy(a) for a in low.table.emit())
    counters = torch.zeros(low.table.n_counters, dtype=torch.int32)
    arena, weights = low.load(tensors)
    threaded(T.task_program, (3,), rows_t, starts, counters, arena, weights,
             torch.from_numpy(low.args), 1, 0, TILE=16, BLOCK_N=16, IS_INTERP=True,
             timeout_s=240)
    with torch.no_grad():
        want = branches(layer, x)
    for got, ref in zip(low.outputs(arena), want):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    names = [k.name for k in low.compiled.kernels]
    second = names.index("layer_norm", 1)          # the second branch's first kernel
    assert len(set(_split_regions(graph, 3))) == 1
    assert len(set(_split_regions(graph, 3, unordered=(second,)))) == 2
    chain, _ = _traced(layer, x, feed_forward_halves)
    assert len(set(_split_regions(chain, 3))) == 1


def test_coverage_counts_what_lowers_and_names_what_does_not():
    """`coverage` (printed by `python -m gpu.wpk.stages`): the feed-forward stack and
    perception's whole step lower; a kernel without a task op is counted and named."""
    run = feed_forward_stage("tiny", rows=4)
    ff = L.coverage(trace(run.fn, run.named), 4)
    assert ff["lowered"] == ff["kernels"] == 16 and not ff["top_reasons"]
    step = L.coverage(trace(**_traceable(perception_stage("tiny", "fp32", 3))), 3)
    assert step["lowered"] == step["kernels"] and not step["top_reasons"]
    for kind in ("softmax", "conv", "copy", "pointwise", "gemm"):
        assert step["by_kind"][kind]["lowered"] > 0
    layer, cfg = _layer(False)
    graph, _ = _traced(layer, torch.randn(4, cfg.d_model),
                       lambda layer, x: torch.sort(layer.feed_forward1.linear1(x), -1).values)
    sort = L.coverage(graph, 4)
    assert sort["lowered"] == sort["kernels"] - 1
    assert any("sort has no task op" in r for r in sort["top_reasons"])


@pytest.mark.parametrize("programs,weights,counters", [
    (2, torch.float32, None), (3, torch.bfloat16, None), (3, torch.float32, TileBlocks(4))])
def test_perceptions_whole_step_lowered_runs_as_the_model(programs, weights, counters):
    """Perception's streaming step for two sessions (tiny config): every kernel of it — the
    subsampling convolutions and pads, the attention's ring writes, relative-position gather,
    masks and softmax, the convolution module's cache and depthwise convolution, the GEMMs
    and norms — as one task-table launch, two beats in a row (the second reads the state the
    first wrote). Outputs and every state tensor equal the model's (fp32 at 1e-5), or stay
    within bf16's error with bf16 weights. Catches a scatter writing the wrong slot, a
    gather reading the wrong position, a mask or a pad misplaced, a tile count that lets a
    kernel start early, and an int or bool value mis-held as fp32; with tile-level counters,
    a block that starts before the blocks it reads from."""
    run = perception_stage("tiny", "fp32", 2, device="cpu")
    graph = trace(**_traceable(perception_stage("tiny", "fp32", 2, device="cpu")))
    low = lower(graph, 2, programs, weight_dtype=weights, counters=counters)
    rows_t, starts = (torch.from_numpy(a) for a in low.table.emit())
    args = torch.from_numpy(low.args)
    counters = torch.zeros(low.table.n_counters, dtype=torch.int32)
    tensors = run.tensors()
    for beat in (1, 2):
        arena, w = low.load(tensors)
        with torch.no_grad():
            want = run.fn()                 # updates the state tensors in place
        threaded(T.task_program, (programs,), rows_t, starts, counters, arena, w, args, beat,
                 0, TILE=16, BLOCK_N=16, IS_INTERP=True, timeout_s=240)
        got = low.outputs(arena) + [low.named(arena, f"state:{f}") for f in
                                    ("k", "v", "time", "frames")]
        ref = list(want) + [tensors[f"state:{f}"].float() for f in ("k", "v", "time", "frames")]
        for g, r in zip(got, ref):
            if weights == torch.float32:
                torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
            else:
                err = ((g - r).abs().max() / r.abs().max().clamp_min(1e-9)).item()
                assert err < 3e-2, err


def test_bucket_tables_share_the_state_a_beat_of_any_bucket_leaves():
    """Perception lowered for buckets of 1 and 3 sessions (tiny config, 4 slots): beats of
    either bucket, in any order, on one arena, equal the model stepping the same sessions in
    the same slots — the state one bucket's beat writes is where the other's reads it. Catches
    a table whose slot state or weights lie elsewhere than another's, a bucket picked too
    small, and counters or epochs shared across tables (a wait that ends early or never)."""
    from gpu.model.config import VoiceChatConfig
    from gpu.model.perception import Perception, PerceptionState, init_random
    from gpu.wpk.buckets import lower_buckets

    def graph_at(b):
        return trace(**_traceable(perception_stage("tiny", "fp32", b, device="cpu",
                                                   slots_total=4)))
    tables = lower_buckets(graph_at, (1, 3), 2)
    assert [tables.pick(n) for n in (1, 2, 3)] == [1, 3, 3]
    with pytest.raises(ValueError, match="largest bucket"):
        tables.pick(4)
    fixed = perception_stage("tiny", "fp32", 3, device="cpu", slots_total=4).tensors()
    arena, weights = tables.load({k: t for k, t in fixed.items() if not k.startswith("input:")})
    cfg = VoiceChatConfig.named("tiny").perception
    model = Perception(cfg, device="cpu", dtype=torch.float32)
    model.load_named(init_random(cfg, torch.Generator().manual_seed(0)))
    state = PerceptionState.alloc(cfg, 4, device="cpu", dtype=torch.float32)
    gen = torch.Generator().manual_seed(9)
    launches = {b: 0 for b in tables.tables}
    counters = {b: torch.zeros(t.table.n_counters, dtype=torch.int32)
                for b, t in tables.tables.items()}
    for slots in ([2], [0, 2, 1], [2], [1, 0]):        # slot 3 is the spare
        b = tables.pick(len(slots))
        rows = slots + [3] * (b - len(slots))
        low = tables.tables[b]
        windows = torch.randn(b, 2, cfg.window_cols, cfg.mel_bins, generator=gen)
        low.write(arena, "input:windows", windows)
        low.write(arena, "input:slots", torch.tensor(rows))
        launches[b] += 1
        rows_t, starts = (torch.from_numpy(a) for a in low.table.emit())
        threaded(T.task_program, (2,), rows_t, starts, counters[b], arena, weights,
                 torch.from_numpy(low.args), launches[b], 0, TILE=16, BLOCK_N=16,
                 IS_INTERP=True, timeout_s=240)
        with torch.no_grad():
            want = model.step_frames(state, windows, torch.tensor(rows))
        for got, ref in zip(low.outputs(arena), (want.enc, want.audio)):
            torch.testing.assert_close(got[:len(slots)], ref[:len(slots)], rtol=1e-5,
                                       atol=1e-5)
    for f in ("k", "v", "time", "frames"):
        torch.testing.assert_close(low.named(arena, f"state:{f}"), getattr(state, f).float(),
                                   rtol=1e-5, atol=1e-5)

    def state_grows(b):                 # a state sized by the batch cannot be shared
        return trace(**_traceable(perception_stage("tiny", "fp32", b, device="cpu")))
    with pytest.raises(ValueError, match="cannot share an arena"):
        lower_buckets(state_grows, (1, 2), 2)
