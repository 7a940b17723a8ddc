"""The collector is timed per beat, and start-up objects are frozen out of its scans."""
from __future__ import annotations

import gc

from wave_actors.gc_pauses import GcPauses, freeze_startup


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


def test_freeze_startup_freezes_once_per_process():
    kept = [_Cycle() for _ in range(10)]           # alive now: frozen (or frozen already)
    first = freeze_startup()
    assert first > 0 and gc.get_freeze_count() == first
    gc.disable()
    try:
        later = [_Cycle() for _ in range(10)]
        assert freeze_startup() == first            # a second node's start freezes nothing new
        del later
    finally:
        gc.enable()
    assert gc.collect() >= 10                       # objects made after it are still collected
    assert kept
