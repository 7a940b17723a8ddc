"""Outbound audio: a playout buffer that smooths the node's bursts into one RTP packet per tick,
and a drift-free tick schedule from an injected monotonic clock.

The node emits 80 ms frames, two per 160 ms beat, in one burst. The `Playout` buffer takes those
bytes and gives one 20 ms packet per tick. It starts playing once `prebuffer` is held, so that the
next burst lands before the buffer runs dry; when it does run dry (an underrun, counted) it sends
silence to keep the RTP stream and its timestamps continuous, raises its prebuffer by one packet
(up to `max_prebuffer_ms`: the adaptive part) and resumes when the prebuffer is held again. Its
size is bounded (`capacity_ms`): beyond it the oldest audio is dropped and counted.

`ticks` yields tick k at t0 + k * ptime, computed from k, never from the previous wake-up, so
timing errors do not accumulate. A tick served late is sent at once (a burst of at most
`max_catchup` packets); beyond that the missed ticks are skipped and reported so that the RTP
timestamp still advances with real time.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import AsyncIterator, Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass(frozen=True)
class PlayoutConfig:
    rate: int = 8000
    ptime_ms: int = 20
    prebuffer_ms: int = 40           # held before playing starts or resumes after an underrun
    max_prebuffer_ms: int = 100      # ceiling of the adaptive prebuffer
    capacity_ms: int = 480           # bound of the buffer (3 beats): older audio is dropped
    max_catchup: int = 3             # late ticks sent in a burst before ticks are skipped
    silence: int = 0xFF              # the codec's silence byte (G.711: 1 byte a sample)

    @property
    def samples_per_packet(self) -> int:
        return self.rate * self.ptime_ms // 1000

    @property
    def ptime(self) -> float:
        return self.ptime_ms / 1000

    def bytes_for(self, ms: int) -> int:
        return self.rate * ms // 1000


@dataclass
class PlayoutStats:
    bytes_in: int = 0
    chunks_in: int = 0               # node frames pushed
    packets_out: int = 0             # audio packets taken
    silence_out: int = 0             # silence packets taken while refilling after an underrun
    underruns: int = 0               # times the buffer ran dry while playing
    dropped_bytes: int = 0           # oldest audio dropped at capacity
    skipped_ticks: int = 0           # ticks lost to a stalled loop (timestamps still advance)
    max_depth_ms: int = 0
    prebuffer_ms: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class Playout:
    """Bursty bytes in, one packet of `samples_per_packet` bytes out per `take()`."""

    def __init__(self, config: PlayoutConfig = PlayoutConfig()):
        self.cfg = config
        self._buf = bytearray()        # invariant: len <= bytes_for(capacity_ms)
        self._started = False          # first audio ever has been played
        self._playing = False          # False while (re)filling to the prebuffer
        self._prebuffer = config.bytes_for(config.prebuffer_ms)
        self.stats = PlayoutStats(prebuffer_ms=config.prebuffer_ms)

    @property
    def depth_ms(self) -> int:
        return len(self._buf) * 1000 // self.cfg.rate

    @property
    def started(self) -> bool:
        return self._started

    def push(self, data: bytes) -> None:
        self.stats.bytes_in += len(data)
        self.stats.chunks_in += 1
        self._buf += data
        excess = len(self._buf) - self.cfg.bytes_for(self.cfg.capacity_ms)
        if excess > 0:
            del self._buf[:excess]
            self.stats.dropped_bytes += excess
        self.stats.max_depth_ms = max(self.stats.max_depth_ms, self.depth_ms)

    def take(self) -> bytes | None:
        """The next packet's payload; silence while refilling; None before the first audio."""
        n = self.cfg.samples_per_packet
        if not self._playing:
            if len(self._buf) < self._prebuffer:
                if not self._started:
                    return None
                self.stats.silence_out += 1
                return bytes([self.cfg.silence]) * n
            self._playing = self._started = True
        if len(self._buf) < n:                           # ran dry: an underrun
            self.stats.underruns += 1
            self._playing = False
            step = self.cfg.bytes_for(self.cfg.ptime_ms)
            self._prebuffer = min(self._prebuffer + step,
                                  self.cfg.bytes_for(self.cfg.max_prebuffer_ms))
            self.stats.prebuffer_ms = self._prebuffer * 1000 // self.cfg.rate
            if not self._buf:
                self.stats.silence_out += 1
                return bytes([self.cfg.silence]) * n
        payload = bytes(self._buf[:n]).ljust(n, bytes([self.cfg.silence]))
        del self._buf[:n]
        self.stats.packets_out += 1
        return payload


async def ticks(clock: Clock, period: float, max_catchup: int) -> AsyncIterator[int]:
    """Yield before each tick the number of ticks skipped just before it (normally 0).

    Tick k is due at t0 + k * period (t0 = the clock at the first call): drift-free.
    """
    t0, k = clock.now(), 0
    while True:
        k += 1
        wait = t0 + k * period - clock.now()
        skipped = 0
        if wait > 0:
            await clock.sleep(wait)
        else:
            behind = int(-wait / period)             # whole ticks already missed after this one
            if behind > max_catchup:
                skipped, k = behind, k + behind
        yield skipped
