"""Flood limits of the node's front: a token bucket per sender, where the sender is what a client
cannot choose (its CURVE key, else its network address), never the routing identity a client
picks for itself.

A sender's rate and burst scale with its live sessions (a bridge carrying 200 calls may send
200 times what one call does). Past its burst, messages are dropped and counted; the sender is
told with `error overloaded` at most once per `notice_interval_s`, and each notice says how many
messages were dropped since the previous one, so the sender can account for every message.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    stamp: float
    noticed: float = -1e9
    unnoticed: int = 0              # dropped since the last notice


@dataclass(frozen=True, kw_only=True)
class FloodPolicy:
    rate: float = 500.0              # messages/s per sender and per live session of it
    burst: float = 1000.0
    notice_interval_s: float = 1.0   # at most one `overloaded` notice per sender this often
    max_senders: int = 10_000        # tracked at once; quiet ones are forgotten past this

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1 or self.notice_interval_s <= 0:
            raise ValueError("rate > 0, burst >= 1 and notice_interval_s > 0 are required")


class FloodGate:
    def __init__(self, policy: FloodPolicy):
        self.policy = policy
        self._buckets: dict[str, _Bucket] = {}
        self.dropped = 0

    def admit(self, sender: str, sessions: int, now: float) -> tuple[bool, int | None]:
        """(admitted, notice): `notice` is the count of messages dropped since the last notice
        when one is due now (the caller sends `overloaded`), else None."""
        p = self.policy
        b = self._buckets.get(sender)
        if b is None:
            if len(self._buckets) >= p.max_senders:
                self._forget_quiet(now)
            b = self._buckets[sender] = _Bucket(p.burst, now)
        scale = 1 + sessions
        b.tokens = min(p.burst * scale, b.tokens + (now - b.stamp) * p.rate * scale)
        b.stamp = now
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return True, None
        self.dropped += 1
        b.unnoticed += 1
        if now - b.noticed >= p.notice_interval_s:
            b.noticed, dropped, b.unnoticed = now, b.unnoticed, 0
            return False, dropped
        return False, None

    def _forget_quiet(self, now: float) -> None:
        """Senders whose bucket has refilled are indistinguishable from new ones: forget them."""
        full = [s for s, b in self._buckets.items()
                if b.tokens + (now - b.stamp) * self.policy.rate >= self.policy.burst]
        for s in full or list(self._buckets)[: len(self._buckets) // 2]:
            del self._buckets[s]
