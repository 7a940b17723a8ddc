"""The collector's pauses are timed, counted and handed out per beat."""
from __future__ import annotations

import gc
import weakref

from wave_actors.runtime.gc_pauses import FULL_EVERY, YOUNG_EVERY, GcPauses, collect_between_beats


class _Cycle:
    def __init__(self):
        self.me = self


def test_collections_are_timed_and_counted_until_uninstalled():
    pauses = GcPauses().install()
    try:
        pauses.take()
        gc.disable()                                # no automatic pass frees them early
        try:
            for _ in range(1000):
                _Cycle()
        finally:
            gc.enable()
        assert gc.collect(2) >= 1000                # the cycles were garbage, found by a full pass
        assert pauses.full_collections >= 1 and pauses.collections >= 1
        spent = pauses.take()
        assert spent > 0.0 and pauses.longest_full_s > 0.0
        assert pauses.take() == 0.0                 # taken: nothing pending
    finally:
        pauses.uninstall()
    seen = pauses.collections
    gc.collect(0)
    assert pauses.collections == seen               # no longer called


def test_between_beats_the_clock_collects_only_where_the_collector_is_off():
    assert gc.isenabled()
    assert collect_between_beats(0) is None          # automatic collection runs: left to it
    gc.disable()
    try:
        gens = [collect_between_beats(k) for k in range(2 * FULL_EVERY)]
        assert gens.count(2) == 2 and gens[FULL_EVERY - 1] == 2
        assert gens.count(1) == 2 * FULL_EVERY // YOUNG_EVERY - 2
        assert gens[0] == 0 and gens[YOUNG_EVERY - 1] == 1
        gc.collect()                                 # a clean start: all that is young is new
        refs = [weakref.ref(_Cycle()) for _ in range(100)]
        assert all(r() is not None for r in refs)    # garbage, but cycles: nothing frees them
        collect_between_beats(0)                     # the youngest generation: the cycles go
        assert all(r() is None for r in refs)
    finally:
        gc.enable()
