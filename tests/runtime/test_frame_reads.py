"""The clock reads its frame batches at intervals (`ClockPolicy.frames_every_s`), each read
taking everything waiting, instead of waking for every batch; a release still drains what came
since, so no frame misses its beat for it.

Catches: a reader that wakes for every batch again (the interval lost: its cost grows with the
messages, not the beats), frames left unread or lost when a read takes many messages at once,
and (engine's clock) a read scheduled inside the hold before a release, where it would stand
between the loop and the release.
"""
import asyncio

import numpy as np

from sim.costmodel import CostModel
from sim.executor import SimExecutor
from tests.nodekit import VirtualNode
from wave_actors.clock.frames_in import READ_BEFORE_HOLD_S
from wave_actors.core.sched.clock_policy import ClockPolicy
from wave_actors.core.contract import ExecutorOptions
from wave_actors.core.frames import BEAT_S, SAMPLES_IN
from wave_actors.core.sched.start_policy import EagerStarts
from wave_actors.core.timebase import Clock
from wave_actors.engine.to_workers import engine_clock

SESSIONS, BEATS = 8, 12
SPREAD_S = 0.01              # the sessions' frames arrive over this much of each 80 ms
FLAT = "bench/costmodel_flat100.json"


def test_many_small_batches_are_read_in_few_reads_and_every_frame_is_heard():
    vn = VirtualNode(SESSIONS)
    try:
        clock = vn.node.clock_actor
        reads, messages = [], []
        frames_in = clock.frames_in.take

        def counting(batch):
            if batch:
                reads.append(vn.clock.now())
                messages.append(len(batch))
            frames_in(batch)
        clock.frames_in.take = counting
        sessions = [vn.run(vn.client.open(f"s{i}")) for i in range(SESSIONS)]
        frame = np.full(SAMPLES_IN, 0.5, np.float32).tobytes()
        start = vn.clock.now()

        async def speak(cs, offset: float):
            # Each session's frames on their own offset in the 80 ms frame: a batch each.
            await vn.clock.sleep_until(start + offset)
            for k in range(2 * BEATS):
                await cs.send_audio(frame)
                await vn.clock.sleep_until(start + offset + (k + 1) * BEAT_S / 2)

        async def body():
            reads.clear()
            messages.clear()
            await asyncio.gather(*[speak(cs, i * SPREAD_S / SESSIONS)
                                   for i, cs in enumerate(sessions)])
            await vn.clock.sleep(2 * BEAT_S)          # the last frames packed
        vn.run(body())
        sent = SESSIONS * 2 * BEATS
        elapsed = vn.clock.now() - start
        every = clock.policy.frames_every_s
        assert every > 0, "the default policy reads on arrival"
        # A read at most every interval, plus each release's drain.
        assert len(reads) <= elapsed / every + elapsed / BEAT_S + 2
        assert sum(messages) >= 1.5 * len(reads)      # reads took several batches each
        assert sum(messages) >= sent // 2             # the sessions' frames came as batches
        heard = clock.jitter_totals.frames_in
        queued = sum(len(clock.slots.table.jitter.queued(s)) for s in clock.slots.table.entries)
        assert heard + queued == sent and clock.stats.dropped_frames == 0
    finally:
        vn.close()


class _At(Clock):
    def __init__(self, t: float):
        super().__init__()
        self.t = t

    def now(self) -> float:
        return self.t


def test_the_engines_reads_stop_short_of_each_hold():
    policy = ClockPolicy()
    hold, every = policy.release_hold_s, policy.frames_every_s
    opts = ExecutorOptions(max_sessions=2, cost_model=FLAT)
    at = _At(0.0)
    clock = engine_clock(SimExecutor(opts, CostModel.load(FLAT, "reference"), at), None,
                         "inproc://unused", at, policy, EagerStarts(), 0, False, lambda m: None)
    clock.t0 = 10.0
    for release in (10.0 + BEAT_S, 10.0 + 7 * BEAT_S):
        hold_start = release - hold
        for now in np.linspace(release - BEAT_S + 1e-4, release - 1e-4, 400):
            at.t = now
            nxt = clock.frames_in.next_read(every)
            assert now < nxt <= now + every
            inside = hold_start - READ_BEFORE_HOLD_S < nxt < release
            assert not inside or now >= hold_start - READ_BEFORE_HOLD_S, (now, nxt)
            if now < hold_start - READ_BEFORE_HOLD_S < now + every:
                assert nxt == hold_start - READ_BEFORE_HOLD_S      # the last read before it
