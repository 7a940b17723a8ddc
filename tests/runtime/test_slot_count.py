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
