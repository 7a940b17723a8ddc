"""The time-bounded reorder buffer (pure: time passed in, no sleeping).

Invariants: every pushed item is released exactly once, rejected, or still held; releases come
in strictly increasing seq order; nothing is held past `gap_wait_s` once `due` has been called at
the deadline; every seq below the next expected one was released, rejected, or reported skipped.
"""
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from wave_actors.core.reorder import ReorderBuffer, Released

WAIT = 0.05


def test_in_order_messages_pass_straight_through():
    """Bug it catches: a buffer that holds (delays) messages that arrived in their turn."""
    buf = ReorderBuffer(WAIT)
    for seq in range(5):
        assert buf.push(seq, f"m{seq}", now=seq * 0.08) == Released((f"m{seq}",), (seq,))
    assert buf.held() == 0 and buf.deadline() is None and buf.next_seq == 5


def test_a_gap_filled_in_time_releases_everything_in_order():
    """Bug it catches: a late-but-in-time message skipped, or releases out of seq order."""
    buf = ReorderBuffer(WAIT)
    buf.push(0, "a", 0.0)
    assert buf.push(2, "c", 0.10) == Released()
    assert buf.deadline() == 0.10 + WAIT
    assert buf.push(1, "b", 0.12).items == ("b", "c")
    assert buf.held() == 0 and buf.deadline() is None


def test_a_lost_seq_waits_at_most_gap_wait_then_is_skipped_and_reported():
    """Bug it catches: a gap that waits for N later messages (640 ms at 8 × 80 ms) instead of a
    time limit, or a skip nobody is told about."""
    buf = ReorderBuffer(WAIT)
    buf.push(0, "a", 0.0)
    buf.push(2, "c", 0.16)
    assert buf.due(0.16 + WAIT - 1e-6) == Released()         # not yet
    out = buf.due(0.16 + WAIT)
    assert out.items == ("c",) and out.skipped == (range(1, 2),) and out.n_skipped == 1
    assert buf.push(1, "b", 0.30).rejected == (1,)            # its turn has passed


def test_a_push_after_the_deadline_releases_what_the_timer_missed():
    """Bug it catches: an overdue gap that stays held until the timer fires, though a message
    has already come by, and the one that just filled a gap skipped anyway."""
    buf = ReorderBuffer(WAIT)
    buf.push(1, "b", 0.0)                     # seq 0 missing
    out = buf.push(0, "a", 1.0)               # long overdue, but here now: released, not skipped
    assert out.items == ("a", "b") and out.skipped == ()
    buf.push(3, "d", 1.0)                     # seq 2 missing
    out = buf.push(5, "f", 2.0)               # the timer never fired: 2 skipped, d released
    assert out.items == ("d",) and out.skipped == (range(2, 3),) and buf.held() == 1


def test_duplicates_are_rejected_held_or_released():
    """Bug it catches: a duplicate heard twice."""
    buf = ReorderBuffer(WAIT)
    buf.push(0, "a", 0.0)
    buf.push(2, "c", 0.0)
    assert buf.push(0, "a", 0.01).rejected == (0,)
    assert buf.push(2, "c", 0.01).rejected == (2,)
    assert buf.held() == 1


def test_a_far_jump_is_bounded_by_max_held():
    """Bug it catches: a client skipping far ahead growing the held set without bound."""
    buf = ReorderBuffer(WAIT, max_held=4)
    out = [buf.push(seq, seq, 0.0) for seq in range(10, 16)]
    assert buf.held() <= 4
    assert out[-2].skipped == (range(0, 10),) and out[-2].items == (10, 11, 12, 13, 14)


def test_zero_wait_never_holds():
    """Bug it catches: gap_wait_s=0 still holding a message until the next call."""
    buf = ReorderBuffer(0.0)
    out = buf.push(3, "d", 0.0)
    assert out.items == ("d",) and out.skipped == (range(0, 3),) and buf.held() == 0


class ReorderMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.buf = ReorderBuffer(WAIT, max_held=6)
        self.now = 0.0
        self.pushed: list[int] = []             # seqs, one per push
        self.released: list[int] = []
        self.rejected: list[int] = []
        self.skipped: set[int] = set()

    def _take(self, out: Released) -> None:
        assert out.items == out.seqs                # items are their seqs here
        self.released += out.seqs
        self.rejected += out.rejected
        for r in out.skipped:
            assert not set(r) & self.skipped
            self.skipped |= set(r)

    @rule(ahead=st.integers(-4, 8), dt=st.floats(0.0, 0.1))
    def push(self, ahead, dt):
        self.now += dt
        seq = max(0, self.buf.next_seq + ahead)
        self.pushed.append(seq)
        self._take(self.buf.push(seq, seq, self.now))

    @precondition(lambda self: self.buf.deadline() is not None)
    @rule(late=st.floats(0.0, 0.02))
    def timer(self, late):
        self.now = max(self.now, self.buf.deadline() + late)
        self._take(self.buf.due(self.now))

    @invariant()
    def released_once_in_order(self):
        assert self.released == sorted(set(self.released))

    @invariant()
    def everything_accounted_for(self):
        assert len(self.released) + len(self.rejected) + self.buf.held() == len(self.pushed)
        assert not self.skipped & set(self.released)
        below = set(range(self.buf.next_seq))
        assert below <= set(self.released) | self.skipped

    @invariant()
    def nothing_held_past_its_wait(self):
        # after every call, whatever is held arrived at most WAIT ago and is not yet due
        deadline = self.buf.deadline()
        assert (deadline is None) == (self.buf.held() == 0)
        assert deadline is None or self.now < deadline <= self.now + WAIT


# the edit loop keeps the arrival-order property below; make test runs the machine too
TestReorder = pytest.mark.slow(ReorderMachine.TestCase)
TestReorder.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.floats(0.0, 0.2)), max_size=60))
def test_any_arrival_order_is_released_in_order_once(arrivals):
    """Bug it catches: a release out of order or twice under any interleaving of arrivals and
    timer firings."""
    buf, now, out = ReorderBuffer(WAIT), 0.0, []
    for seq, dt in arrivals:
        now += dt
        if (d := buf.deadline()) is not None and d <= now:
            out += buf.due(d).seqs
        r = buf.push(seq, seq, now)
        out += r.seqs
    assert out == sorted(set(out))
    assert set(out) <= {seq for seq, _ in arrivals}


def test_the_in_order_fast_path_agrees_with_push():
    """`in_order` is the allocation-free path the session takes for the common case; it must
    release exactly what `push` would, and refuse whenever anything is held or out of turn."""
    a, b = ReorderBuffer(), ReorderBuffer()
    for seq, now in [(0, 0.0), (1, 0.01), (3, 0.02), (2, 0.03), (4, 0.04), (6, 0.05), (7, 0.2)]:
        if a.in_order(seq):
            got_a = (seq,)
        else:
            got_a = a.push(seq, seq, now).seqs
        got_b = b.push(seq, seq, now).seqs
        assert got_a == got_b and a.next_seq == b.next_seq, (seq, got_a, got_b)
    assert not a.in_order(a.next_seq + 1)


def test_skip_ledger_gives_each_skipped_seq_once_and_forgets_the_oldest_runs():
    """Bug it catches: a message arriving after its gap was given up on counted lost twice
    (as a gap, then as stale), or one arriving twice uncounted the second time."""
    from wave_actors.core.reorder import SkipLedger
    ledger = SkipLedger(max_runs=2)
    ledger.add(range(3, 6), 320)
    ledger.add(range(0), 99)                    # an empty run is not a run
    assert ledger.take(4) == 320
    assert ledger.take(4) is None               # the second arrival is a duplicate
    assert ledger.take(3) == 320 and ledger.take(5) == 320 and ledger.take(6) is None
    ledger.add(range(10, 11), 1)
    ledger.add(range(20, 21), 2)
    ledger.add(range(30, 31), 3)                # the bound forgets the run of seq 10
    assert ledger.take(10) is None and ledger.take(20) == 2 and ledger.take(30) == 3


def test_a_learnt_wait_covers_the_paths_reordering_decays_and_is_capped():
    """With a `Reach`: a message trailing its successor by the prebuffer's 240 ms is released,
    not skipped; a path that trails further raises the wait, never past MAX_GAP_WAIT_S; after
    a minute of no reordering the wait is back near `gap_wait_s`."""
    from wave_actors.core.reorder import MAX_GAP_WAIT_S, Reach
    buf = ReorderBuffer(WAIT, reach=Reach())
    assert buf.push(1, "b", 0.0).items == ()
    assert buf.push(0, "a", 0.24).items == ("a", "b")            # in time: released in order
    assert buf.push(3, "d", 1.0).items == ()
    skipped = buf.due(1.0 + buf.wait_s(1.0))
    assert [list(r) for r in skipped.skipped] == [[2]]
    assert buf.push(2, "c", 1.35).rejected == (2,)               # trailed "d" by 0.35 s
    assert 0.35 < buf.wait_s(1.35) <= MAX_GAP_WAIT_S
    buf.push(4, "e", 1.4)                                       # in order: no gap, no change
    assert buf.wait_s(1.4) <= MAX_GAP_WAIT_S
    assert buf.wait_s(100.0) < 0.07                              # a quiet path: short again
