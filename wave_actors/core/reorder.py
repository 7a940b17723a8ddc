"""A time-bounded reorder buffer for one session's numbered (`seq`) input messages.

A message that arrives ahead of its turn is held until the seqs before it arrive, but for at most
`gap_wait_s` after its own arrival: then the seqs still missing before it are skipped (reported,
so the caller counts them) and it is released, with whatever held messages follow it in order.
A duplicate, or a message whose turn has passed (released or skipped), is rejected.

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
                 max_held: int = MAX_HELD):
        if gap_wait_s < 0 or max_held < 1:
            raise ValueError("gap_wait_s must be >= 0 and max_held >= 1")
        self.gap_wait_s, self.max_held = gap_wait_s, max_held
        self._next = first_seq                      # the seq whose turn it is
        self._held: dict[int, tuple[object, float]] = {}    # seq > _next → (item, give-up time)

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
        return min((d for _item, d in self._held.values()), default=None)

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
        else:
            # Held first, then expiries: a message that fills a gap whose wait has just run out
            # (the timer not yet fired) is still released, not skipped.
            self._held[seq] = (item, now + self.gap_wait_s)
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

    def _expire(self, now: float, out: _Out) -> None:
        expired = [seq for seq, (_item, d) in self._held.items() if d <= now]
        if expired:
            self._advance_to(max(expired), out)

    def _advance_to(self, last: int, out: _Out) -> None:
        """Releases every held seq up to `last` in order, skipping the missing ones, then the
        run that follows."""
        for seq in sorted(s for s in self._held if s <= last):
            if seq > self._next:
                out.skipped.append(range(self._next, seq))
            self._release(seq, out)
        self._release_run(out)

    def _release_run(self, out: _Out) -> None:
        while self._next in self._held:
            self._release(self._next, out)

    def _release(self, seq: int, out: _Out) -> None:
        item, _deadline = self._held.pop(seq)
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
