"""The guarded start policy: start rows and snapshot copies ride only where the beat, as
forecast from the beats run, still ends a margin before its deadline.

Bugs these catch: rows forced into a beat the forecast says they make late (the old
`max_hold`); copies unbounded in one beat; a forecast learned from a beat's whole time with its
start work in it (rows then look free); an idle node that never carries rows (no beat to
learn from); a cost that falls at once after one fast beat; a caller's copy held behind
rolls that could run a beat later (its open waited beats for nothing); early rolls dropped
from a beat with no room at all (sessions that started together then all roll at once).
"""
import pytest

from wave_actors.core.sched.slot_book import SlotBook
from wave_actors.core.sched.start_shape import StartShape
from wave_actors.core.sched.snapshots import SnapshotIndex
from wave_actors.core.sched.start_policy import GuardedStarts

CAPTURES = (0, 4, 16)


def guarded(**kw) -> GuardedStarts:
    p = GuardedStarts(**kw)
    p.know_rows({4: 0.008, 16: 0.030})
    return p


def book_with(p: GuardedStarts, slots: int = 8) -> tuple[SlotBook, SnapshotIndex]:
    shape = StartShape(prefill_chunk=4, start_rows=16, small_rows=4, max_prompt=16)
    index = SnapshotIndex(4, 1e9, lambda n: 100 + n, 4)
    return SlotBook(slots, shape, p, 1000, 8, index), index


def test_an_idle_node_carries_every_start():
    p = guarded()
    book, _ = book_with(p)
    for s in range(5):
        book.open(s, [1, 2, 3, s])             # five prompts of their own
    plan = book.plan(0.15)
    assert plan.resets == list(range(5)) and len(plan.rows) == 5


def test_rows_ride_only_in_the_capture_that_fits():
    p = guarded(margin_s=0.008)
    p.observe_beat(100, 0, 0, 0, 0, 0.100)
    # 150 ms left: 100 + 8 margin: 42 ms of room: 16 rows (30 ms) fit
    assert p.rows_in(p.start_room(100, 0.150), CAPTURES) == 16
    # 120 ms left: 12 ms of room: only the 4-row capture (8 ms)
    assert p.rows_in(p.start_room(100, 0.120), CAPTURES) == 4
    # 110 ms left: 2 ms: none, however long a start has waited
    assert p.rows_in(p.start_room(100, 0.110), CAPTURES) == 0


def test_a_start_waits_for_a_beat_with_room_and_is_counted():
    p = guarded(margin_s=0.008)
    book, _ = book_with(p)
    p.plain_s = {0: 0.0, 1: 0.145}
    book.open(0, [1, 2, 3])
    book.plan(0.16)                            # idle: it starts
    book.plan(0.16)
    assert book.ready(0)
    book.open(1, [7, 8, 9])
    plans = [book.plan(0.16) for _ in range(5)]    # 7 ms of room: the reset, no row fits
    assert not any(p_.rows for p_ in plans) and p.held_back >= 4
    p.plain_s[1] = 0.100
    plan = book.plan(0.16)
    assert plan.rows and plan.rows[0][0] == 1


def test_resets_past_the_room_wait_for_the_next_beat():
    p = guarded(margin_s=0.0, reset_s=0.010)
    book, _ = book_with(p, 12)
    p.plain_s = {n: 0.125 for n in range(13)}      # 35 ms of room: 3 resets a beat
    book.open(0, [1])
    book.plan(0.16)
    book.plan(0.16)
    for s in range(1, 10):
        book.open(s, [1, 2, 3, s])
    got = [book.plan(0.16).resets for _ in range(4)]
    assert [len(r) for r in got] == [3, 3, 3, 0]
    assert sorted(sum(got, [])) == list(range(1, 10)) and p.resets_held == 6 + 3


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


def test_rows_held_after_one_slow_beat_with_rows_ride_again():
    """Bug it catches: one slow beat that carried start rows (a cold first prefill on a slow
    host) set their learned cost past every later beat's room; rows were then never measured
    again, and every start that needed rows waited for ever (the demo's second call timed out
    waiting for `opened`). While rows wait, their cost falls back towards the build's."""
    p = GuardedStarts(margin_s=0.008, fall=0.1)
    p.know_rows({4: 0.008})                         # one row capture, as the CPU executor's
    shape = StartShape(prefill_chunk=4, start_rows=4, small_rows=0, max_prompt=16)
    book = SlotBook(8, shape, p, 1000, 8, SnapshotIndex(4, 1e9, lambda n: 100 + n, 4))
    p.observe_beat(1, 0, 0, 0, 0, 0.080)
    p.observe_beat(1, 4, 0, 0, 0, 0.170)            # 90 ms for 4 rows, once
    assert p.rows_in(p.start_room(1, 0.155), (0, 4)) == 0
    book.open(0, [1, 2, 3])
    book.plan(0.16)                                 # idle: it starts (no one to make late)
    book.plan(0.16)
    assert book.ready(0)
    book.open(1, [7, 8, 9, 10, 11])                 # a prompt of its own: rows, no copy
    waited = 0
    while not book.plan(0.155).rows:
        waited += 1
        assert waited < 40, "the start never rides"
    assert waited >= 3 and p.held_back >= waited    # it waited while the cost fell back
    assert p.row_s[4] < 0.155 - 0.008 - 0.080


def test_the_book_holds_copies_past_the_budget_for_the_next_beat():
    """With a tight budget the book copies only what fits and keeps the rest opened; each
    goes live in a later beat, none is lost or copied twice."""
    p = guarded(margin_s=0.0, copy_s=0.010, reset_s=0.0)
    book, index = book_with(p)
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


def rolling_book(tight: float, open_late: bool) -> tuple[SlotBook, list]:
    """Five sessions started from one snapshot, run with ample room until their contexts
    near the end (40 frames, rolls of 8: early rolls from context 29), then one beat with
    `tight` seconds left past a 100 ms forecast; `open_late`: a sixth caller opens before it."""
    p = guarded(margin_s=0.0, copy_s=0.004, reset_s=0.0, roll_s=0.004)
    shape = StartShape(prefill_chunk=4, start_rows=16, small_rows=4, max_prompt=16)
    book = SlotBook(8, shape, p, 40, 8, SnapshotIndex(4, 1e9, lambda n: 100 + n, 4))
    book.open(0, [1, 2, 3])
    book.plan(0.16)
    book.plan(0.16)
    for s in range(1, 5):
        book.open(s, [1, 2, 3])
    book.plan(0.16)
    p.plain_s = {n: 0.1 for n in range(9)}
    while book.context(1) < 29:                  # the next beat's rolls are early ones
        book.plan(0.16)
    if open_late:
        book.open(5, [1, 2, 3])
    return book, [book.plan(0.1 + tight) for _ in range(2)]


def test_a_waiting_copy_displaces_an_early_roll_not_the_reverse():
    _, (base, _) = rolling_book(0.006, open_late=False)
    early = len(base.roll)
    assert early >= 2 and not base.copies       # two early rolls (8 ms) where 6 ms are left
    book, (plan, after) = rolling_book(0.006, open_late=True)
    assert [s for s, _, _ in plan.copies] == [5] and book.ready(5)
    assert len(plan.roll) == early - 1          # the emptiest early roll waits a beat
    assert {s for s, _ in plan.roll} < {s for s, _ in base.roll}
    assert len(after.roll) >= 1                 # and rolls in the next


def test_a_beat_without_room_still_spreads_its_rolls_and_holds_the_copy():
    _, (base, _) = rolling_book(-0.001, open_late=False)
    book, (plan, _) = rolling_book(-0.001, open_late=True)
    assert plan.roll == base.roll and len(plan.roll) >= 2
    assert not plan.copies and not book.ready(5)


def test_an_unmeasured_count_is_forecast_on_the_line_through_its_neighbours():
    p = guarded()
    p.observe_beat(100, 0, 0, 0, 0, 0.080)
    p.observe_beat(200, 0, 0, 0, 0, 0.120)
    assert p.forecast(150) == pytest.approx(0.100)
    assert p.forecast(250) == pytest.approx(0.140)        # past the last: along the line
    assert p.forecast(50) == pytest.approx(0.080 * 1.0)   # below the first: never below it


def test_start_work_priced_low_is_learned_from_the_beats_that_carried_it():
    """Bug it catches: a reset priced at a tenth of its cost lets a burst of opens overrun the
    beat every time (the node's first H200 fill: 148 resets in one beat, 180 ms)."""
    p = guarded(reset_s=0.0002, copy_s=0.0001, fall=0.5)
    p.observe_beat(10, 0, 0, 0, 0, 0.050)
    for _ in range(2):       # the true costs: 2 ms a reset, 0.4 a copy (one scale for both)
        p.observe_beat(10, 0, 10, 10, 0, 0.050 + 10 * 0.002 + 10 * 0.0004)
    assert 10 * (p.reset_est + p.copy_est) == pytest.approx(0.024, rel=0.01)
    room = p.start_room(10, 0.16)
    assert int(room / (p.reset_est + p.copy_est)) < 50    # starts a beat: no longer hundreds
    for _ in range(30):                             # cheaper beats: it falls back, slowly
        p.observe_beat(10, 0, 5, 5, 0, 0.050 + 5 * 0.0005)
    assert 5 * (p.reset_est + p.copy_est) < 0.010


def test_admission_weighs_the_steady_host_share_not_a_moment():
    """Bug caught: admission that adds the worst recent host share (each beat's time_left
    already leaves the clock's worst of 16) refuses calls the node was sized for after one
    slow moment, for as long as it stays in the window; one that ignores the host share
    admits calls a node with a slow host cannot carry."""
    from wave_actors.core.frames import BEAT_S
    from wave_actors.core.sched.start_policy import HOST_BEATS
    p = guarded()
    p.know_beats({1: 0.020, 300: 0.142})
    p.start_room(280, BEAT_S - 0.025)        # a fill's first beat, the clock catching up
    assert p.admit(299, 0, 300) is None      # too few beats to say what the host takes
    for _ in range(HOST_BEATS):
        p.start_room(280, BEAT_S - 0.003)    # steady: 3 ms of host a beat
    for _ in range(16):
        p.start_room(280, BEAT_S - 0.030)    # one slow moment, as the clock's max carries it
    assert p.admit(299, 0, 300) is None
    for _ in range(HOST_BEATS):
        p.start_room(280, BEAT_S - 0.015)    # a host that now takes 15 ms every beat
    assert p.admit(299, 0, 300) is not None
    assert p.admit(200, 0, 300) is None      # ... still carries fewer


def test_a_node_late_without_any_start_work_still_starts_its_admitted_calls():
    """Bug caught: a node whose beats run past the deadline with no start work at all (a
    model too slow for its host) left every admitted open waiting for ever: no beat ever had
    room, so no reset, copy or row rode, and no caller heard `opened` or a refusal."""
    from wave_actors.core.frames import BEAT_S
    from wave_actors.core.sched.start_policy import OVERLOADED_START_S
    p = guarded()
    book, _ = book_with(p)
    book.open(0, [1, 2, 3])
    for _ in range(8):                      # the first session starts and goes live
        plan = book.plan(BEAT_S)
        book.observe(plan, 1.0)             # a 1 s beat
    assert book.ready(0)
    book.open(1, [1, 2, 3])                 # the same prompt: a copy-start
    book.open(2, [7, 8, 9, 10, 11])         # a new prompt: rows
    for _ in range(12):
        plan = book.plan(0.0)               # always behind
        book.observe(plan, 1.0)
    assert book.ready(1) and book.ready(2)
    assert p.start_room(1, 0.0) == OVERLOADED_START_S and p.describe()["beats_overloaded"] > 0
