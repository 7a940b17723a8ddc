"""The benchmark's callers in load-generator processes (wave_actors/bench_clients.py): a real-time
run through them accounts for every session, and a generator that dies ends the run with a
clear error instead of waiting for sessions that never come."""
import asyncio
import time

import pytest

from wave_actors import bench
from wave_actors.bench_clients import Generators


def test_a_real_time_run_through_two_generator_processes_accounts_for_every_session(tmp_path):
    args = bench.parse_args(["--backend", "sim", "--sessions", "5", "--beats", "12",
                             "--client-procs", "2", "--warmup-max", "8", "--out", str(tmp_path)])
    (res,) = bench.measure(args, 5)
    assert res.beats == 12 and res.refusals == 0 and res.errors == 0
    # every session reported its `closed` stats through its generator: frames went both ways
    assert res.frames_in > 5 * 12 and res.frames_out > 5 * 12


def test_a_generator_that_dies_is_reported_while_the_run_waits():
    async def scenario() -> str:
        callers = Generators("tcp://127.0.0.1:9", 2, 2)     # nothing answers: opens hang
        try:
            callers._procs[0].terminate()
            deadline = time.monotonic() + 30
            while callers.failed() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            with pytest.raises(RuntimeError, match="exited with code"):
                await bench._while_alive(callers, asyncio.sleep(60))
            return callers.failed()
        finally:
            callers.kill()
    assert "bench-load-0" in asyncio.run(scenario())
