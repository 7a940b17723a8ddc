"""A time-bounded reorder buffer for one session's numbered (`seq`) input messages.

A message that arrives ahead of its turn is held until the seqs before it arrive, but for at most
a wait after its own arrival: then the seqs still missing before it are skipped (reported, so
the caller counts them) and it is released, with whatever held messages follow it in order.
A duplicate, or a message whose turn has passed (released or skipped), is rejected.

The wait is `gap_wait_s`, or with a `Reach` it is learnt from the connection (as a jitter buffer
learns its delay): how long its gaps stayed open before their messages came, in time or after
being given up, plus a margin, decaying back to `gap_wait_s` on a path that stops reordering
and never past MAX_GAP_WAIT_S. A path that shuffles its frames within a few frames' time is
so heard whole, at the cost of that much more delay; a lost message costs at most the wait.

Waiting for a count of later messages instead makes one loss cost as long as that many messages
take to arrive (8 × 80 ms of audio), and the stretch then sits in the jitter buffer as delay.

Pure: no asyncio, no sockets, time passed in. The owner calls `push` for each message and `due`
when `deadline()` has passed (a timer), so a gap never waits on a message that never comes.
Invariant: every pushed item is released exactly once, rejected, or still held; releases are in
strictly increasing seq order.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

# 50 ms: shorter than the frame (80 ms) the jitter buffer keeps in reserve past its lowest recent
# level (`jitter.Shedding.keep`), so waiting out a gap does not by itself empty the queue and
# cost an underrun; longer than a reordered message usually trails its successor (a few ms up to
# a few tens of ms on one path), so a message that is only late still makes it.
GAP_WAIT_S = 0.05
# Messages held at most: past it the earliest gap is given up at once. A bound on memory against
# a client that skips far ahead; at 80 ms a message it is never reached within GAP_WAIT_S.
MAX_HELD = 64
# Runs of given-up seqs remembered (`SkipLedger`): a message that arrives after its gap was given
# up on comes within a few runs; an older one is counted as a stale message.
SKIPS_REMEMBERED = 64
# A connection's reordering, learnt (`Reach`). It starts at the jitter buffer's prebuffer (3
# frames, 240 ms): a call's first frames play from that reserve, so waiting that long for a
# missing one costs nothing yet, and a path that reorders shows how far before it can lose a
# frame. Waits never pass MAX_GAP_WAIT_S: the latency a reordering path may add.
START_REACH_S = 0.24
MAX_GAP_WAIT_S = 0.40
REACH_MARGIN_S = 0.02
# A path that stops reordering returns to GAP_WAIT_S within ~3 half-lives (a minute): one
# that reorders now and then keeps its wait between the times it shows it.
REACH_HALF_LIFE_S = 20.0
SKIPS_TIMED = 16            # given-up runs whose successor's arrival is kept, to learn from


@dataclass
class Reach:
    """How long this connection's messages trail their successors: the longest a gap stayed
    open before its message came (filled in time, or arriving after it was given up), decaying
    with a half-life so a path that stops reordering returns to the short wait. A gap's wait is
    that reach and a margin, between the buffer's `gap_wait_s` and `max_s`."""
    start_s: float = START_REACH_S
    max_s: float = MAX_GAP_WAIT_S
    margin_s: float = REACH_MARGIN_S
    half_life_s: float = REACH_HALF_LIFE_S
    value: float = -1.0                     # set from `start_s` at the first message
    at: float | None = None

    def now_s(self, now: float) -> float:
        if self.at is None:
            self.value, self.at = self.start_s, now
        return self.value * 0.5 ** (max(0.0, now - self.at) / self.half_life_s)

    def saw(self, trail_s: float, now: float) -> None:
        self.value, self.at = max(self.now_s(now), trail_s), now

    def wait_s(self, now: float, floor_s: float) -> float:
        return min(self.max_s, max(floor_s, self.now_s(now) + self.margin_s))


@dataclass(frozen=True)
class Released:
    items: tuple = ()                       # released, in seq order
    seqs: tuple[int, ...] = ()              # their seqs
    rejected: tuple[int, ...] = ()          # duplicates, and seqs whose turn had passed
    skipped: tuple[range, ...] = ()         # seqs given up on (never received), as ranges

    @property
    def n_skipped(self) -> int:
        return sum(len(r) for r in self.skipped)


@dataclass
class _Out:
    items: list = field(default_factory=list)
    seqs: list = field(default_factory=list)
    rejected: list = field(default_factory=list)
    skipped: list = field(default_factory=list)

    def freeze(self) -> Released:
        return Released(tuple(self.items), tuple(self.seqs), tuple(self.rejected),
                        tuple(self.skipped))


class ReorderBuffer:
    def __init__(self, gap_wait_s: float = GAP_WAIT_S, first_seq: int = 0,
                 max_held: int = MAX_HELD, reach: Reach | None = None):
        """`reach`: learn the wait from the connection's reordering (None: `gap_wait_s`
        always)."""
        if gap_wait_s < 0 or max_held < 1:
            raise ValueError("gap_wait_s must be >= 0 and max_held >= 1")
        self.gap_wait_s, self.max_held, self.reach = gap_wait_s, max_held, reach
        self._next = first_seq                      # the seq whose turn it is
        # seq > _next → (item, give-up time, arrival)
        self._held: dict[int, tuple[object, float, float]] = {}
        # given-up runs and when the message after each arrived (what a late one trails)
        self._given_up: collections.deque[tuple[range, float]] = collections.deque(
            maxlen=SKIPS_TIMED)

    def wait_s(self, now: float) -> float:
        """How long a gap opened now is waited for."""
        return self.gap_wait_s if self.reach is None else self.reach.wait_s(now, self.gap_wait_s)

    @property
    def next_seq(self) -> int:
        return self._next

    def held(self) -> int:
        """Messages still waiting (at close: received but never released)."""
        return len(self._held)

    def take_held(self) -> list:
        """At close: the items still waiting, in seq order; the buffer forgets them."""
        items = [self._held[seq][0] for seq in sorted(self._held)]
        self._held.clear()
        return items

    def deadline(self) -> float | None:
        """When `due` must next be called; None while nothing is held."""
        return min((d for _item, d, _at in self._held.values()), default=None)

    def in_order(self, seq: int) -> bool:
        """The common case, without allocating: `seq` is the one whose turn it is and nothing
        is held, so it is released at once (the caller takes its item). False: use `push`."""
        if seq != self._next or self._held:
            return False
        self._next = seq + 1
        return True

    def push(self, seq: int, item: object, now: float) -> Released:
        out = _Out()
        if seq < self._next or seq in self._held:
            out.rejected.append(seq)
            self._learn_late(seq, now)
        else:
            self._learn_fill(seq, now)
            # Held first, then expiries: a message that fills a gap whose wait has just run out
            # (the timer not yet fired) is still released, not skipped.
            self._held[seq] = (item, now + self.wait_s(now), now)
        self._expire(now, out)
        self._release_run(out)
        while len(self._held) > self.max_held:
            self._advance_to(min(self._held), out)
        return out.freeze()

    def due(self, now: float) -> Released:
        """Gives up on the gaps whose wait has run out by `now`; releases what follows them."""
        out = _Out()
        self._expire(now, out)
        return out.freeze()

    def _learn_fill(self, seq: int, now: float) -> None:
        """`seq` fills a gap: how long the held messages after it waited for it."""
        if self.reach is None:
            return
        after = [at for held, (_i, _d, at) in self._held.items() if held > seq]
        if after:
            self._saw(now - min(after), now)

    def _learn_late(self, seq: int, now: float) -> None:
        """`seq` came after its gap was given up: how long after its successor it came."""
        if self.reach is None:
            return
        for run, successor_at in self._given_up:
            if seq in run:
                self._saw(now - successor_at, now)
                return

    def _saw(self, trail_s: float, now: float) -> None:
        self.reach.saw(trail_s, now)
        wait = self.wait_s(now)             # a longer wait applies to the gaps open now too
        for seq, (item, deadline, at) in self._held.items():
            self._held[seq] = (item, max(deadline, at + wait), at)

    def _expire(self, now: float, out: _Out) -> None:
        expired = [seq for seq, (_item, d, _at) in self._held.items() if d <= now]
        if expired:
            self._advance_to(max(expired), out)

    def _advance_to(self, last: int, out: _Out) -> None:
        """Releases every held seq up to `last` in order, skipping the missing ones, then the
        run that follows."""
        for seq in sorted(s for s in self._held if s <= last):
            if seq > self._next:
                out.skipped.append(range(self._next, seq))
                # what waited for it longest: the earliest arrival after the run
                first = min(at for held, (_i, _d, at) in self._held.items() if held >= seq)
                self._given_up.append((range(self._next, seq), first))
            self._release(seq, out)
        self._release_run(out)

    def _release_run(self, out: _Out) -> None:
        while self._next in self._held:
            self._release(self._next, out)

    def _release(self, seq: int, out: _Out) -> None:
        item, _deadline, _at = self._held.pop(seq)
        out.items.append(item)
        out.seqs.append(seq)
        self._next = seq + 1


class SkipLedger:
    """Seqs given up on (`Released.skipped`) and the samples each was counted as lost, so that
    one arriving after all is counted once: its estimate gives way to its real size. Bounded:
    the oldest runs are forgotten first."""

    def __init__(self, max_runs: int = SKIPS_REMEMBERED):
        self._runs: collections.deque[tuple[range, int]] = collections.deque(maxlen=max_runs)

    def add(self, seqs: range, each: int) -> None:
        if len(seqs):
            self._runs.append((seqs, each))

    def take(self, seq: int) -> int | None:
        """The estimate `seq` was counted as, if it was given up on and not taken before; the
        ledger forgets it (a second arrival is a duplicate)."""
        for i, (run, each) in enumerate(self._runs):
            if seq in run:
                del self._runs[i]
                for part in (range(run.start, seq), range(seq + 1, run.stop)):
                    if len(part) and len(self._runs) < (self._runs.maxlen or 0):
                        self._runs.append((part, each))
                return each
        return None
