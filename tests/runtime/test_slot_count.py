"""How a node's slot count is decided: `--max-sessions` when given, else the executor sizes
itself on a GPU (memory and the measured beat), else CPU_SLOTS."""
import pytest

from sim.executor import SimExecutor
from wave_actors.core.contract import ExecutorOptions
from wave_actors.node.cli import CPU_SLOTS, parse_args, slots_asked, slots_line


def test_max_sessions_when_given_else_sized_on_a_device_else_the_cpu_default():
    assert slots_asked(parse_args(["--backend", "sim", "--max-sessions", "3"])) == 3
    assert slots_asked(parse_args(["--backend", "sim"])) == CPU_SLOTS
    assert slots_asked(parse_args(["--backend", "cpu"])) == CPU_SLOTS
    # 0 asks the device executor to size its slots (bug: a fixed default of 8 on a GPU)
    assert slots_asked(parse_args(["--backend", "graph"])) == 0


def test_a_zero_slot_count_is_refused_by_an_executor_that_does_not_size_itself():
    with pytest.raises(ValueError, match="needs a slot count"):
        SimExecutor(ExecutorOptions(max_sessions=0))
    with pytest.raises(ValueError, match="at least 1"):
        ExecutorOptions(max_sessions=-1)
    with pytest.raises(SystemExit):
        parse_args(["--backend", "sim", "--max-sessions", "0"])


def test_the_operator_is_told_how_the_count_was_decided():
    given = slots_line({"max_sessions": 3}, parse_args(["--backend", "sim", "--max-sessions", "3"]))
    assert given == "slots: 3 (--max-sessions)"
    sized = slots_line({"max_sessions": 96, "slots": {
        "sessions": 96, "decided_by": "the beat at full context", "memory_ceiling": 122,
        "budget_ms": 136.0, "beat_ms_at_context": {61: 80.0, 122: 150.0, 96: 130.0}}},
        parse_args(["--backend", "sim"]))
    assert "slots: 96" in sized and "memory holds 122" in sized and "136.0 ms" in sized


def test_nodes_sharing_a_gpu_each_plan_within_their_share():
    """Bug caught: nodes sharing a GPU (the fleet's --per-gpu) each sized themselves from the
    device's free memory, so the first to build planned with the whole device and the next
    found none. Two dense nodes on an H200 at half each: both hold sessions and their
    allocations fit the device together (each carries its own 23.8 GB of weights)."""
    from gpu.engine.memory_plan import MemoryPlan, planned_memory
    from gpu.model.config import Profile, VoiceChatConfig

    def plan(n: int) -> MemoryPlan:
        return MemoryPlan(VoiceChatConfig.full(), Profile.named("dense"), n, 1500, 512, 0.5e9)

    total, context = 150.1e9, 0.6e9            # an H200; a CUDA context a process

    def two_nodes(share: float) -> tuple[int, int, float]:
        first = plan(1).ceiling(planned_memory(total - context, total, share))
        used = plan(first).total
        second = plan(1).ceiling(planned_memory(total - 2 * context - used, total, share))
        return first, second, used + plan(max(second, 1)).total + 2 * context

    first, second, both = two_nodes(1.0)
    assert second == 0                          # the bug: the first took the device
    first, second, both = two_nodes(0.5)
    assert 0 < second <= first < plan(1).ceiling(total - context) / 2
    assert both <= total
    # a node alone plans with what is free, within its share less what it holds already
    assert planned_memory(10e9, total) == 10e9
    assert planned_memory(100e9, total, 0.5, used=20e9) == 0.5 * total - 20e9


def test_a_gpu_share_is_a_fraction_of_one_gpu():
    assert parse_args(["--backend", "sim"]).gpu_share == 1.0
    assert parse_args(["--backend", "sim", "--gpu-share", "1/2"]).gpu_share == 0.5
    assert parse_args(["--backend", "sim", "--gpu-share", "0.25"]).gpu_share == 0.25
    for bad in ("0", "1.5", "-1/2", "1/0", "half"):
        with pytest.raises(SystemExit):
            parse_args(["--backend", "sim", "--gpu-share", bad])
    with pytest.raises(ValueError, match="gpu_share"):
        ExecutorOptions(gpu_share=0.0)
