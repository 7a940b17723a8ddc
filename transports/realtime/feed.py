"""Client input -> the node at the model's pace: a bounded queue, and silence while the client
sends nothing.

A Realtime client may append audio faster than real time (a file, a test's burst of frames)
or stop appending while the call goes on (a muted microphone, push-to-talk). The node takes a
session's input at its frame rate and ends a session that hears nothing of its own, so the
bridge sits between the two:

- Appended audio (already in the node's format) is queued, up to `capacity_s` of audio; what
  does not fit is refused whole, and the caller tells the client and counts it.
- `take(now)` gives what is due by `now`: queued audio up to `lead_s` ahead of real time
  (the node's jitter buffer holds a little; more would overflow it), and, when the queue is
  empty and the client has appended nothing for `silence_after_s`, silence up to real time
  (every tick, until it appends again). So a connected client is a live call: the node hears
  silence, not nothing. A client that streams, even a little slower than real time, gets no
  silence between its appends (gaps in its speech would be the bridge's).

Real time counts from the first `take`. Pure: the caller passes the time.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass


@dataclass(frozen=True)
class FeedPolicy:
    capacity_s: float = 60.0          # audio queued at most; an append past it is refused
    lead_s: float = 0.24              # sent at most this far ahead of real time
    silence_after_s: float = 0.5      # no append this long: silence keeps up with real time
    tick_s: float = 0.04              # how often the feed is looked at

    def __post_init__(self) -> None:
        if self.capacity_s <= 0 or self.lead_s < 0 or self.silence_after_s <= 0 \
                or self.tick_s <= 0:
            raise ValueError("capacity_s, silence_after_s and tick_s must be > 0, lead_s >= 0")


class InputFeed:
    def __init__(self, policy: FeedPolicy, bytes_per_s: int, sample_bytes: int,
                 max_message_bytes: int):
        self.policy = policy
        self.bps, self.sample_bytes = bytes_per_s, sample_bytes
        self.max_message = max_message_bytes - max_message_bytes % sample_bytes
        self.capacity = self._whole(policy.capacity_s * bytes_per_s)
        self._queue: collections.deque[bytes] = collections.deque()
        self.queued = 0                 # bytes waiting
        self.sent = 0                   # bytes given out, audio and silence
        self.silence_bytes = 0          # of them, silence
        self.refused_bytes = 0          # appends that did not fit
        self.high_water = 0
        self._t0: float | None = None
        self._last_push: float | None = None

    def _whole(self, nbytes: float) -> int:
        n = int(nbytes)
        return n - n % self.sample_bytes

    def push(self, pieces: list[bytes], now: float) -> bool:
        """Queues the pieces of one append (made at `now`) whole, or refuses them all
        (counted) when they would pass the bound."""
        self._last_push = now
        size = sum(map(len, pieces))
        if self.queued + size > self.capacity:
            self.refused_bytes += size
            return False
        self._queue.extend(bytes(p) for p in pieces if p)
        self.queued += size
        self.high_water = max(self.high_water, self.queued)
        return True

    def take(self, now: float) -> list[bytes]:
        """The messages due by `now` (each at most `max_message_bytes`), in order."""
        return [data for data, _ in self.take_pieces(now)]

    def requeue(self, pieces: list[tuple[bytes, bool]]) -> None:
        """Pieces `take_pieces` gave that were not sent after all (the sender was stopped
        midway): the client's audio back at the front of the queue, in order; the silence
        forgotten (it is made again if still due)."""
        for data, silence in reversed(pieces):
            self.sent -= len(data)
            if silence:
                self.silence_bytes -= len(data)
            else:
                self._queue.appendleft(data)
                self.queued += len(data)

    def take_pieces(self, now: float) -> list[tuple[bytes, bool]]:
        """`take`, each message with whether it is silence the feed made."""
        if self._t0 is None:
            self._t0 = now
        if self._last_push is None:
            self._last_push = now
        real = self._whole((now - self._t0) * self.bps)
        out: list[tuple[bytes, bool]] = []
        budget = real + self._whole(self.policy.lead_s * self.bps) - self.sent
        while self._queue and budget > 0:
            head = self._queue[0]
            n = min(len(head), self._whole(budget), self.max_message)
            if n <= 0:
                break
            out.append((head[:n], False))
            if n == len(head):
                self._queue.popleft()
            else:
                self._queue[0] = head[n:]
            self.queued -= n
            self.sent += n
            budget -= n
        behind = real - self.sent
        if not self._queue and now - self._last_push >= self.policy.silence_after_s:
            while behind > 0:
                n = min(behind, self.max_message)
                out.append((bytes(n), True))    # zeros: silence in f32 and in PCM alike
                self.sent += n
                self.silence_bytes += n
                behind -= n
        return out

    def clear(self) -> int:
        """Drops what is queued (the client asked: `input_audio_buffer.clear`); returns how
        many bytes."""
        n, self.queued = self.queued, 0
        self._queue.clear()
        return n

    def seconds(self, nbytes: int) -> float:
        return nbytes / self.bps
