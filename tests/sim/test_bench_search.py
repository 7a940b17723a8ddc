"""find-max's search (wave_actors/bench/capacity.py), with the measurement replaced by a known capacity:
it returns the largest N with zero late beats in every run, to the requested resolution, and
never probes above the memory ceiling."""
import argparse
from unittest import mock

from hypothesis import given, settings, strategies as st

from wave_actors.bench import capacity as bench, results


def _result(n: int, late: int) -> results.RunResult:
    return results.RunResult(n, 10, late, 100.0, 120.0, 130.0, 90.0, 0, 0, 0, 0, 0, 0)


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 300), start=st.integers(1, 200), step=st.integers(1, 16),
       ceiling=st.one_of(st.none(), st.integers(1, 400)))
def test_find_max_brackets_the_capacity(capacity, start, step, ceiling):
    probed = []

    def measure(args, n, backend=None):
        probed.append(n)
        return [_result(n, 0 if n <= capacity else 1)]
    args = argparse.Namespace(sessions=start, max_find=1024, find_step=step)
    with mock.patch.object(bench, "measure", measure):
        found, seen = bench.find_max(args, None, ceiling)
    top = ceiling if ceiling is not None else 1024
    limit = min(capacity, top)
    assert found <= limit and set(seen) <= set(probed)
    assert all(n <= top for n in seen)
    if found:                                      # what it reports was measured and passed
        assert all(r.late_beats == 0 for r in seen[found])
        # to the resolution asked: the true limit is at most max(step, found // 50) above it
        assert limit - found <= max(step, found // 50)
    else:
        assert limit < start
