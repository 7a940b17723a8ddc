"""The guarded start policy: start rows and snapshot copies ride only where the beat, as
forecast from the beats run, still ends a margin before its deadline.

Bugs these catch: rows forced into a beat the forecast says they make late (the old
`max_hold`); copies unbounded in one beat; a forecast learned from a beat's whole time with its
start work in it (rows then look free); an idle node that never carries rows (no beat to
learn from); a cost that falls at once after one fast beat.
"""
import pytest

from wave_actors.core.slot_book import SlotBook, StartShape
from wave_actors.core.snapshots import SnapshotIndex
from wave_actors.core.start_policy import GuardedStarts

CAPTURES = (0, 4, 16)


def guarded(**kw) -> GuardedStarts:
    p = GuardedStarts(**kw)
    p.know_rows({4: 0.008, 16: 0.030})
    return p


def test_an_idle_node_carries_every_start():
    p = guarded()
    assert p.start_budget(0, 3, 0, 5, 3, CAPTURES, 0.15) == (5, 16)


def test_rows_ride_only_in_the_capture_that_fits():
    p = guarded(margin_s=0.008)
    p.observe_beat(100, 0, 0, 0, 0, 0.100)
    # 150 ms left: 100 + 8 margin: 42 ms of room: 16 rows (30 ms) fit
    assert p.start_budget(100, 0, 0, 0, 1, CAPTURES, 0.150)[1] == 16
    # 120 ms left: 12 ms of room: only the 4-row capture (8 ms)
    assert p.start_budget(100, 0, 0, 0, 1, CAPTURES, 0.120)[1] == 4
    # 110 ms left: 2 ms: none, however long the start has waited
    for _ in range(20):
        assert p.start_budget(100, 0, 0, 0, 1, CAPTURES, 0.110)[1] == 0
    assert p.held_back == 20


def test_copies_are_bounded_by_the_room_left():
    p = guarded(margin_s=0.008, copy_s=0.001)
    p.observe_beat(200, 0, 0, 0, 0, 0.130)
    copies, rows = p.start_budget(200, 0, 0, 50, 0, CAPTURES, 0.150)
    assert copies == 12 and rows == 0          # 12 ms of room at 1 ms a copy
    assert p.copies_held == 38


def test_the_forecast_leaves_start_work_out():
    """A beat that carried 16 rows is not the plain beat: its rows' price comes off."""
    p = guarded()
    p.observe_beat(100, 16, 0, 0, 0, 0.130)
    assert p.forecast(100) == pytest.approx(0.100)


def test_a_slow_beat_is_believed_at_once_and_forgotten_slowly():
    p = guarded(fall=0.1)
    p.observe_beat(50, 0, 0, 0, 0, 0.080)
    p.observe_beat(50, 0, 0, 0, 0, 0.120)
    assert p.forecast(50) == pytest.approx(0.120)
    p.observe_beat(50, 0, 0, 0, 0, 0.080)
    assert p.forecast(50) == pytest.approx(0.116)


def test_the_book_holds_copies_past_the_budget_for_the_next_beat():
    """With a tight budget the book copies only what fits and keeps the rest opened; each
    goes live in a later beat, none is lost or copied twice."""
    shape = StartShape(prefill_chunk=4, start_rows=2, small_rows=1, max_prompt=16)
    p = guarded(margin_s=0.0, copy_s=0.010)
    p.know_rows({1: 0.010, 2: 0.020})
    index = SnapshotIndex(4, 1e9, lambda n: 100 + n, 4)
    book = SlotBook(8, shape, p, 1000, 8, index)
    book.open(0, [1, 2, 3])
    book.plan(0.16)
    book.plan(0.16)
    assert book.ready(0) and index.describe()["saves"] == 1
    p.plain_s = {n: 0.125 for n in range(9)}   # 35 ms of room: 3 copies a beat
    for s in range(1, 8):
        book.open(s, [1, 2, 3])
    copied = []
    for _ in range(4):
        plan = book.plan(0.16)
        copied.append(sorted(s for s, _, _ in plan.copies))
    assert [len(c) for c in copied] == [3, 3, 1, 0]
    assert sorted(sum(copied, [])) == list(range(1, 8))
    assert all(book.ready(s) for s in range(8))


def test_an_unmeasured_count_is_forecast_on_the_line_through_its_neighbours():
    p = guarded()
    p.observe_beat(100, 0, 0, 0, 0, 0.080)
    p.observe_beat(200, 0, 0, 0, 0, 0.120)
    assert p.forecast(150) == pytest.approx(0.100)
    assert p.forecast(250) == pytest.approx(0.140)        # past the last: along the line
    assert p.forecast(50) == pytest.approx(0.080 * 1.0)   # below the first: never below it
