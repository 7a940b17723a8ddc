"""Input latency through the whole node on virtual time (`sim.latency`): a stall and its burst,
and 10 % loss, as a client on a real network would cause them. The scheduler-level tests are
`tests/runtime/test_jitter_adaptive.py`."""
import pytest

from sim.latency import STALL, Scenario, call, mean_latency
from wave_actors.core.sched.clock_policy import ClockPolicy

ADAPTIVE = ClockPolicy()
FIXED = ClockPolicy(jitter_shed_per_beat=0)
A, B = STALL.stall


def test_after_a_stall_latency_returns_within_40ms_of_baseline_in_5s():
    rows = call(ADAPTIVE, STALL)
    base = mean_latency(rows, 2.0, A)
    after = mean_latency(rows, B + 5.0, STALL.seconds - 1)
    assert after - base <= 0.040, (base, after)


def test_the_fixed_buffer_keeps_the_stall_for_the_rest_of_the_call():
    """The bug this replaces: 1,292 ms for the rest of the call after one 1.2 s stall."""
    rows = call(FIXED, STALL)
    base = mean_latency(rows, 2.0, A)
    after = mean_latency(rows, B + 5.0, STALL.seconds - 1)
    assert after - base > 0.8, (base, after)


@pytest.mark.parametrize("seed", [1, 2])
def test_under_10_percent_loss_latency_stays_within_100ms_of_baseline(seed):
    base = mean_latency(call(ADAPTIVE, Scenario(seed=seed)), 2.0, 23.0)
    lossy = mean_latency(call(ADAPTIVE, Scenario(loss=0.10, seed=seed)), 2.0, 23.0)
    assert lossy - base <= 0.100, (base, lossy)
