"""`ExecutorOptions` refuses settings no executor can run, with the setting named, before
anything is built (a bad bench or node flag fails at start, not mid-run)."""
from __future__ import annotations

import math

import pytest

from wave_actors.bench.backend import executor_options
from wave_actors.bench.cli import parse_args
from wave_actors.core.contract import ExecutorOptions


@pytest.mark.parametrize("kw,says", [
    ({"first_poll_ms": -0.5}, "first_poll_ms"), ({"first_poll_ms": math.nan}, "first_poll_ms"),
    ({"start_rows": -1}, "start_rows"), ({"max_sessions": -1}, "max_sessions"),
    ({"context_offset": 1500}, "context_offset")])
def test_impossible_settings_are_refused_by_name(kw, says):
    with pytest.raises(ValueError, match=says):
        ExecutorOptions(**kw)


def test_the_bench_passes_the_frame_zero_poll_interval_through():
    """Catches a flag parsed but never handed to the executor (the run would silently spin)."""
    assert executor_options(parse_args(["--first-poll-ms", "0.5"]), 4).first_poll_ms == 0.5
    assert executor_options(parse_args([]), 4).first_poll_ms == 0.0
    with pytest.raises(ValueError, match="first_poll_ms"):
        executor_options(parse_args(["--first-poll-ms", "-1"]), 4)
