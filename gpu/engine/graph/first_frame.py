"""Frame 0 of a beat routed while frame 1 computes.

Inside the beat, once frame 0's outputs are written, every slot's frame-0 rows are copied to
pinned memory on a side stream, then a count of the beats that got that far; frame 1 does not
wait for the copies. The host polls the count and copies the live rows into the output ring.
One stream orders the copies, so a host that sees the count sees the rows.
"""
from __future__ import annotations

import asyncio
import collections
import time
from typing import Callable

import torch

from wave_actors.core.contract import BeatOutput
from wave_actors.core.sched.slot_book import BookPlan

POLL_LEAD_S = 1.5e-3         # poll from this long before the fastest recent time
POLL_UNKNOWN_S = 5e-4        # nothing measured yet: poll at this interval


class FirstFrame:
    def __init__(self, d_out: dict[str, torch.Tensor], device: torch.device, poll_s: float):
        """`d_out`: the executor's device outputs [slots, frames, ...]; `poll_s`: the polling
        interval (0: every loop iteration)."""
        self._d_out, self.poll_s = d_out, poll_s
        self._dev = {k: torch.empty(v[:, 0].shape, dtype=v.dtype, device=device)
                     for k, v in d_out.items()}
        self._host = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
                      for k, v in self._dev.items()}
        self._count = torch.zeros(1, dtype=torch.int64, device=device)
        self._seen = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        self._seen_np = self._seen.numpy()
        self.stream = torch.cuda.Stream()
        self._pending: tuple | None = None          # (out, rows, count before the beat)
        self._recent: dict[tuple[int, int], collections.deque] = {}

    def copy_out(self) -> None:
        """Inside the beat, after frame 0's outputs are written: the rows and then the count,
        on the side stream."""
        side = self.stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for name, dev in self._dev.items():
                dev.copy_(self._d_out[name][:, 0])
                self._host[name].copy_(dev, non_blocking=True)
            self._count.add_(1)
            self._seen.copy_(self._count, non_blocking=True)

    def join(self) -> None:
        """At the beat body's end: the side stream joined (a capture must end joined)."""
        torch.cuda.current_stream().wait_stream(self.stream)

    def expect(self, plan: BookPlan, out: BeatOutput) -> None:
        """Before the beat is queued: the count it must pass (the last beat's copies are done:
        its end waited for them)."""
        hi = max(plan.live, default=-1) + 1
        self._pending = (out, hi, int(self._seen_np[0])) if hi else None

    async def wait(self, t0: float, key: tuple[int, int], ended: Callable[[], bool]) -> None:
        """Sleeps to the fastest recent frame 0 of this graph (`key`), then polls the count
        (every `poll_s`, which spares the loop a spin's CPU at up to an interval's delay) until
        it passes, then copies the live rows' frame 0 into the `out` of `expect`. `ended()`:
        the beat ended without a frame 0 (its wait says why)."""
        if self._pending is None:
            return
        out, hi, before = self._pending
        recent = self._recent.setdefault(key, collections.deque(maxlen=8))
        fastest = min(recent, default=None)
        every = self.poll_s
        if fastest is not None:
            delay = t0 + fastest - (every or POLL_LEAD_S) - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        while int(self._seen_np[0]) == before:
            if ended():
                self._pending = None
                return
            await asyncio.sleep(every or (0 if fastest is not None else POLL_UNKNOWN_S))
        recent.append(time.perf_counter() - t0)
        for name, host in self._host.items():
            getattr(out, name)[:hi, 0] = host[:hi].numpy()
        self._pending = None


async def poll_until(done: Callable[[], bool], t0: float, fastest: float | None) -> None:
    """Return once `done()`: asleep until just before t0 + fastest (work that began no earlier
    than t0 and takes at least `fastest` cannot end before), then asking every loop iteration
    (the tasks that are ready run in between, as they would anyway)."""
    if fastest is not None:
        delay = t0 + fastest - POLL_LEAD_S - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    while not done():
        await asyncio.sleep(0 if fastest is not None else POLL_UNKNOWN_S)

