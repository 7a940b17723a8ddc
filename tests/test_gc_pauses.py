"""The collector's pauses are timed, counted and handed out per beat."""
from __future__ import annotations

import gc

from wave_actors.gc_pauses import GcPauses


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
