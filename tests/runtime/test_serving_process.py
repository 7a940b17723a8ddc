"""serving_process: the collector skips what exists when serving starts, threads hand the GIL over
every 0.5 ms, and both are undone on exit (a benchmark run inside a test process)."""
import gc
import sys

import pytest

from wave_actors.engine.serving_process import SWITCH_INTERVAL_S, serving_process


def test_serving_process_sets_then_restores_the_interpreter():
    before, frozen = sys.getswitchinterval(), gc.get_freeze_count()
    assert before != SWITCH_INTERVAL_S
    held = [object() for _ in range(10)]
    assert gc.isenabled()
    with serving_process():
        assert sys.getswitchinterval() == SWITCH_INTERVAL_S
        assert gc.get_freeze_count() >= frozen + len(held)
        assert not gc.isenabled()       # the beat clock collects, between beats
    assert sys.getswitchinterval() == before and gc.get_freeze_count() == 0 and gc.isenabled()


def test_serving_process_restores_after_an_error():
    before = sys.getswitchinterval()
    with pytest.raises(RuntimeError):
        with serving_process():
            raise RuntimeError("a run failed")
    assert sys.getswitchinterval() == before and gc.get_freeze_count() == 0 and gc.isenabled()
