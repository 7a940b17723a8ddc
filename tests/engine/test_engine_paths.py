"""The engine's paths against the reference model: the cpu executor driven as the clock drives
it, the Triton decode path (interpreted on the CPU), the memory plan, and on a GPU the graph
executor."""
import gc

import numpy as np
import pytest
import torch

from gpu.engine.cpu_executor import CpuExecutor
from gpu.engine.decode_ops import TritonDecodeOps, install
from bench.harness.parity import compare, engine_run, reference_run
from gpu.model.config import Profile, VoiceChatConfig
from gpu.model.voicechat import VoiceChat
from tests.tensorkit import exact_fp32, rel
from wave_actors.core.contract import ExecutorOptions, SessionSpec

SPECS = [SessionSpec("You are a helpful assistant."), SessionSpec(""),
         SessionSpec("Answer briefly.", [{"name": "lookup", "description": "d", "parameters": {}}])]




def audio_for(n, frames, seed=0):
    return (0.1 * np.random.default_rng(seed).standard_normal((n, frames, 1280))).astype(np.float32)


def parity(backend, frames: int) -> dict:
    """Run SPECS through `backend` at odd slots and through the eager reference: tokens must be
    equal; returns the comparison for the caller's PCM tolerance."""
    audio = audio_for(len(SPECS), frames)
    run, keys = engine_run(backend, SPECS, audio, [4, 0, 2])
    res = compare(run, reference_run(backend.model, backend.text_codec, SPECS, audio, keys, seed=0))
    assert res["text_equal"] == res["func_equal"] == res["user_equal"] == 1.0, res
    backend.close()
    return res


def test_cpu_executor_equals_reference_model_in_fp32():
    b = CpuExecutor(ExecutorOptions(max_sessions=5, profile="fp32", config="tiny", max_context=64))
    res = parity(b, 6)
    assert res["pcm_max_abs"] < 1e-5, res


def two_frames(model, ops, slots, codec_kernels: bool = True):
    """Two frames of two sessions at `slots` with `ops` installed (None: the eager model), from
    a fresh state warmed up; the second frame reads what the first wrote. `codec_kernels=False`
    keeps the codec on its reference path (interpreted, its kernels are most of the time)."""
    install(model, ops)
    if not codec_kernels:
        model.codec.decode_ops = None
    dev = slots.device
    st = model.alloc_state(4, 16)
    st.reset(slots)
    model.warmup_chunk(st, slots, model.cfg.talker.n_warmup)
    g = torch.Generator().manual_seed(1)
    outs = [model.step(st, 0.1 * torch.randn(2, 1280, generator=g).to(dev), slots,
                       model.noise(0, slots, torch.full((2,), f)), torch.full((2,), -1, device=dev))
            for f in range(2)]
    return outs, st


@pytest.mark.slow
def test_triton_decode_path_equals_reference_step():
    """Interpreted on the CPU; compiled where a GPU is (both sides then run on it)."""
    cfg = VoiceChatConfig.tiny()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = VoiceChat.random(cfg, Profile.named("fp32"), dev, seed=3)
    slots = torch.tensor([3, 0], device=dev)

    def run(ops):
        return two_frames(model, ops, slots)
    with exact_fp32():                  # on the GPU, TF32 would differ by ~1e-2 in the pcm
        ref, st_ref = run(None)
        fast, st_fast = run(TritonDecodeOps())
    install(model, None)
    for a, b in zip(ref, fast):
        assert torch.equal(a.text, b.text) and torch.equal(a.func, b.func)
        assert torch.equal(a.codes, b.codes)
        # fp32 rounding: the engine's codec runs channels-last (its reference is itself ~2e-5
        # from an fp64 run, the tolerance test_model_tts_codec uses)
        torch.testing.assert_close(a.pcm, b.pcm, rtol=1e-5, atol=1e-4)
    # the kernels updated the state in place exactly where the reference wrote it
    torch.testing.assert_close(st_fast.thinker.ssm, st_ref.thinker.ssm, rtol=1e-4, atol=1e-5)
    # the talker's K rows after 28 layers of fp32 reduction-order differences (fused norms):
    # 1e-5 relative over the cache, ~1e-6 absolute on single small elements
    assert rel(st_fast.talker.k, st_ref.talker.k) < 1e-5
    torch.testing.assert_close(st_fast.talker.k, st_ref.talker.k, rtol=1e-4, atol=1e-5)
    assert torch.equal(st_fast.talker.k[[1, 2]], st_ref.talker.k[[1, 2]])     # other slots: zeros
    assert torch.equal(st_fast.thinker.length, st_ref.thinker.length)


def test_memory_plan_matches_model_md():
    from gpu.engine.memory_plan import MemoryPlan
    plan = MemoryPlan(VoiceChatConfig.full(), Profile.named("reference"), 124, 1500, 0)
    # docs/MODEL.md §3, plus the perception's 72-row K/V ring over its channel cache (3,637,248 B)
    # and the talker's padding to an even 1538 positions (516,096 B)
    assert abs(plan.per_session - (965.4e6 + 3_637_248 + 516_096)) < 0.1e6
    assert abs(plan.weights - 23.83e9) < 0.05e9              # docs/MODEL.md §4
    # docs/MODEL.md §4's H200 rows (124 and 324 with a flat 4 GB workspace) under the engine's
    # workspace (2.5 GB + 25 MB per slot, measured) and its one trash slot
    assert plan.ceiling(148e9) == int((148e9 - plan.weights - 2.5e9) // (plan.per_session + 25e6)) - 1 == 121
    dense = MemoryPlan(VoiceChatConfig.full(), Profile.named("dense"), 1, 1500, 0)
    assert dense.ceiling(148e9) == 303
    with pytest.raises(MemoryError, match="at most 121 sessions fit"):
        MemoryPlan(VoiceChatConfig.full(), Profile.named("reference"), 130, 1500, 0).check(148e9)


@pytest.mark.gpu
@pytest.mark.parametrize("variant,wait", [(dict(capture=False), "poll"),
                                          (dict(streams=False), "poll"), ({}, "thread")],
                         ids=["eager", "one-stream", "thread-wait"])
def test_graph_replay_equals_the_same_executor_variant_in_bf16(variant, wait):
    """Same precision, same kernels, same batches: neither capture and replay, nor spreading a
    beat's stages over streams, nor how the loop learns that a beat is done (polling its event,
    or a worker waiting on the device) changes an output bit."""
    from gpu.engine.graph_executor import GraphExecutor
    audio, runs = audio_for(len(SPECS), 50), []
    for kw, beat_wait in (({}, "poll"), (variant, wait)):
        b = GraphExecutor(ExecutorOptions(max_sessions=5, profile="reference", config="tiny",
                                          max_context=128, beat_wait=beat_wait), **kw)
        runs.append(engine_run(b, SPECS, audio, [4, 0, 2])[0])
        assert (b.beats.polled_beats > 0) == (beat_wait == "poll"), b.beats.polled_beats
        b.close()
    res = compare(runs[0], runs[1])
    assert res["text_equal"] == res["func_equal"] == res["user_equal"] == 1.0, res
    assert res["pcm_max_abs"] == 0.0, res


@pytest.mark.gpu
def test_graph_executor_equals_reference_in_fp32_on_the_gpu():
    from gpu.engine.graph_executor import GraphExecutor
    b = GraphExecutor(ExecutorOptions(max_sessions=5, profile="fp32", config="tiny", max_context=128))
    res = parity(b, 50)
    assert res["pcm_rel"] < 1e-3, res


@pytest.mark.gpu
def test_graph_executor_sizes_its_slots_from_memory_and_its_measured_beat():
    """max_sessions 0: the count whose measured beat (start rows, full context) fits the budget,
    never above what memory holds, and the executor still equals the reference after the
    probes scribbled on its slots. The bug it catches: a node that admits more callers than the
    device serves on time, or that sizes itself from nothing it measured."""
    from gpu.engine.graph_executor import GraphExecutor
    b = GraphExecutor(ExecutorOptions(max_sessions=0, profile="fp32", config="tiny",
                                      max_context=128))
    slots, n = b.slots, b.max_sessions
    assert 1 <= n <= slots["memory_ceiling"] and slots["sessions"] == n
    probes = slots["beat_ms_at_context"]
    assert probes and (probes[n] <= slots["budget_ms"] or n == 1), slots
    assert all(t > slots["budget_ms"] for m, t in probes.items() if m > n), slots
    assert b.describe()["max_sessions"] == n and max(k for k, _ in b.graphs.captured) == n
    assert parity(b, 8)["pcm_rel"] < 1e-3


@pytest.mark.gpu
def test_a_node_given_a_share_of_the_gpu_sizes_itself_within_it():
    """--gpu-share (nodes sharing a GPU): the beat's budget is the share's, the memory ceiling
    the share's, and a share too small for the workspace is refused by name before anything
    is built. The bug it catches: the first of two nodes planning with the whole device."""
    from gpu.engine.graph_executor import GraphExecutor
    whole = GraphExecutor(ExecutorOptions(max_sessions=0, profile="fp32", config="tiny",
                                          max_context=128)).slots
    gc.collect()                # the first executor's memory back before the second plans
    torch.cuda.empty_cache()
    half = GraphExecutor(ExecutorOptions(max_sessions=0, profile="fp32", config="tiny",
                                         max_context=128, gpu_share=0.5))
    assert half.slots["budget_ms"] == pytest.approx(whole["budget_ms"] / 2, abs=0.1)
    assert half.max_sessions <= whole["sessions"]
    total = torch.cuda.mem_get_info()[1]
    assert half.describe()["memory_ceiling_sessions"] == half.plan_memory.ceiling(0.5 * total)
    assert parity(half, 8)["pcm_rel"] < 1e-3
    with pytest.raises(MemoryError, match="sessions"):
        GraphExecutor(ExecutorOptions(max_sessions=4, profile="fp32", config="tiny",
                                      max_context=128, gpu_share=0.01))


@pytest.mark.slow
def test_fp8_talker_kv_decode_path_equals_its_reference_step():
    """dense-compact (fp8 talker KV, scales set at load): the Triton decode path (the cache
    write in qk_norm_rope, the attention kernels reading the bits) gives the eager model's
    tokens and stores the same bits. Bug it catches: a kernel and the eager path disagreeing
    on the format or the scales, which teacher-forced fidelity against another profile would
    show only as noise."""
    cfg = VoiceChatConfig.tiny()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = VoiceChat.random(cfg, Profile.named("dense-compact"), dev, seed=3)
    assert model.talker_kv_scale.shape == (cfg.talker.n_layers, 2, cfg.talker.n_kv_heads)
    slots = torch.tensor([3, 0], device=dev)

    ref, st_ref = two_frames(model, None, slots)
    # The codec does not read the talker's cache; its kernels are checked on the fp32 path above.
    fast, st_fast = two_frames(model, TritonDecodeOps(), slots, codec_kernels=False)
    install(model, None)
    assert st_fast.talker.k.dtype == torch.uint8
    for a, b in zip(ref, fast):
        assert torch.equal(a.text, b.text) and torch.equal(a.codes, b.codes)
        assert rel(a.pcm, b.pcm) < 1e-2
    written = (st_ref.talker.k != 0).sum().item()
    assert written and (st_fast.talker.k != st_ref.talker.k).sum().item() <= 0.01 * written


@pytest.mark.slow
def test_a_stochastically_rounded_ssm_state_is_the_same_on_both_decode_paths():
    """A bf16 SSM state rounded stochastically (the `dense-ssm16-sr` option, here with fp32
    arithmetic around it so the two paths' fp32 states agree to an ulp): the Triton decode path
    (the bits drawn in the kernel from the row's position and layer) stores the state the
    eager model stores, and neither stores what rounding to nearest would. Bug it catches: the
    kernel and the eager path keyed by different positions or layers (the engine would drift
    from its reference), or the option not reaching the state (silently off)."""
    cfg = VoiceChatConfig.tiny()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    fp32 = dict(compute=torch.float32, talker_kv=torch.float32, cfg_rows=1, tf32=False,
                ssm=torch.bfloat16)
    sr = Profile("fp32-ssm16-sr", ssm_round="stochastic", **fp32)
    assert Profile.named("dense-ssm16-sr").ssm_round == "stochastic"
    model = VoiceChat.random(cfg, sr, dev, seed=3)
    slots = torch.tensor([3, 0], device=dev)
    ref, st_ref = two_frames(model, None, slots)
    fast, st_fast = two_frames(model, TritonDecodeOps(), slots, codec_kernels=False)
    install(model, None)
    assert st_ref.thinker.ssm_round == "stochastic" and st_fast.thinker.ssm.dtype == torch.bfloat16
    for a, b in zip(ref, fast):
        assert torch.equal(a.text, b.text) and torch.equal(a.codes, b.codes)
    held = st_ref.thinker.ssm[:, [3, 0]]
    assert (st_fast.thinker.ssm[:, [3, 0]] != held).float().mean().item() < 0.01
    near = VoiceChat.random(cfg, Profile("fp32-ssm16", **fp32), dev, seed=3)
    _, st_near = two_frames(near, TritonDecodeOps(), slots, codec_kernels=False)
    install(near, None)
    assert (st_near.thinker.ssm[:, [3, 0]] != held).float().mean().item() > 0.05


@pytest.mark.gpu
def test_the_work_a_beat_queues_behind_its_replay_never_waits_for_the_device():
    """What the launch queues after a beat's replay (a started session's context offset, its
    rolls, its cleans) and before it (resets) is queued while the device still runs: a beat's
    outputs wait for the device, not for the host. The bug it catches: an index tensor made
    from a host list (a copy from pageable memory) that waits for the whole replay, after which
    the launch queues the beat's rolls one by one before the loop may see the beat done (the
    beats that started a session ran 3-9 ms longer with 1-4 rolls)."""
    from types import SimpleNamespace
    from gpu.engine.graph_executor import GraphExecutor
    b = GraphExecutor(ExecutorOptions(max_sessions=6, profile="reference", config="tiny",
                                      max_context=128, context_offset=64))
    th, tk = b.state.thinker, b.state.talker
    plan = SimpleNamespace(roll=[(1, 4), (3, 4)], roll_frames=b.options.roll_frames,
                           cleans=[0, 5], resets=[2, 4], copies=[])

    def queue() -> None:
        with torch.no_grad():
            b.runner.reset_slots(plan)
            b.prefill_context([1, 3])
            b.runner.roll(plan)
            b.runner.clean(plan)

    queue()                                 # kernels loaded, tables built: nothing lazy below
    torch.cuda.synchronize()
    busy = torch.cuda.Event()
    torch.cuda._sleep(4_000_000_000)        # seconds of device time queued ahead of the work
    busy.record()
    queue()
    assert not busy.query(), "the host waited for the device while queuing a beat's work"
    torch.cuda.synchronize()
    before = th.length.clone(), tk.position.clone()
    b.prefill_context([1, 3])               # the offset lands on those slots, and only there
    grew = [(th.length - before[0]).tolist(), (tk.position - before[1]).tolist()]
    want = [64 if slot in (1, 3) else 0 for slot in range(len(th.length))]
    assert grew == [want, want], grew
    b.close()
