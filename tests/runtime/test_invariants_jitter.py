"""Invariant 1 on the array scheduler the clock runs (`jitter_arrays.ArrayScheduler`): drops and
underruns only where due, each counted one for one.

`test_scheduler_props.py` checks drop-on-full for the plain reference's `push`, and
`test_jitter_arrays.py` checks the array scheduler equals the reference; neither states when an
underrun is due. Here, on the clock's own scheduler, for every step of a random run of admits,
single pushes, worker batches (a slot's rows repeated, more than a buffer holds), beats with some
slots not ready, and releases:
  - a push drops exactly `max(0, queued + rows - max_queue)` frames of the slot (a drop only when
    the buffer is full, never more than the excess);
  - a beat serves every held slot that is ready (no starvation), and for each one counts
    `2 - min(2, queued)` underruns if it has started, none otherwise (idle instead): an underrun
    only when the buffer had no frame for it, and the frame taken when there was one;
  - a beat drops nothing but what it sheds (`dropped - shed` moves only at pushes and releases);
  - a slot not in the beat is left alone; a release drops exactly what was queued;
  - the totals are the sum of what each step was due.
`check_jitter_accounting(steps)` is the checking function; `tests/sim/test_mutations.py` plants
bugs and shows it fails.
"""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from wave_actors.core.contract import BeatInput
from wave_actors.core.frames import BEAT_S, FRAMES_PER_BEAT, SAMPLES_IN
from wave_actors.core.sched.jitter import SILENCE, CapacityError, Shedding, SlotStats
from wave_actors.core.sched.jitter_arrays import ArrayScheduler
from wave_actors.core.sched.session_table import SessionTable

SLOTS, PREBUFFER, QUEUE = 4, 3, 6
SHEDDINGS = [None, Shedding(window_s=2 * BEAT_S, keep=0, per_beat=2)]

# One step of a run: ("admit",), ("push", slot pick, rows), ("batch", [slot picks]),
# ("pack", ready set or None), ("release", slot pick). A pick indexes the held slots (mod).
STEP = st.one_of(
    st.just(("admit",)),
    st.tuples(st.just("push"), st.integers(0, 7), st.integers(1, 8)),
    st.tuples(st.just("batch"), st.lists(st.integers(0, 7), min_size=1, max_size=14)),
    st.tuples(st.just("pack"), st.none() | st.frozensets(st.integers(0, SLOTS - 1))),
    st.tuples(st.just("pack"), st.none()),
    st.tuples(st.just("release"), st.integers(0, 7)),
)
# Runs start with two slots held, and are long enough to start slots and drain them dry.
STEPS = st.tuples(st.sampled_from(range(len(SHEDDINGS))),
                  st.lists(STEP, min_size=8, max_size=60).map(lambda s: [("admit",)] * 2 + s))


def _pcm(n: int) -> np.ndarray:
    return np.full((n, SAMPLES_IN), 0.5, np.float32)


def check_jitter_accounting(shedding_index: int, steps: list) -> None:
    table = SessionTable(SLOTS, prebuffer=PREBUFFER, max_queue=QUEUE,
                         shedding=SHEDDINGS[shedding_index])
    a, handles = table.jitter, {}                   # the scheduler as the clock holds it
    inp = BeatInput.alloc(SLOTS)
    due = SlotStats()           # what the totals must be: each step's due counts added up
    sent = {}                                       # slot -> next frame number
    for step in steps:
        held = sorted(sent)
        before = a.stats.copy()
        count = a.count.copy()
        if step[0] == "admit":
            try:
                handle = table.admit(len(sent), None)
                handles[handle.slot], sent[handle.slot] = handle, 0
            except CapacityError:
                assert len(held) == SLOTS, "capacity refused with a slot free"
            continue
        if not held:
            continue
        if step[0] == "push":
            slot = held[step[1] % len(held)]
            for _ in range(step[2]):
                full = a.count[slot] >= QUEUE
                drops = a.stats[slot, _col("dropped")]
                a.push(slot, sent[slot], _pcm(1)[0])
                sent[slot] += 1
                assert a.stats[slot, _col("dropped")] == drops + full, \
                    "a push dropped a frame with room left, or none when full"
                due.dropped += int(full)
        elif step[0] == "batch":
            slots = np.array([held[i % len(held)] for i in step[1]], np.int64)
            nos = np.empty(len(slots), np.int64)
            for i, slot in enumerate(slots.tolist()):
                nos[i], sent[slot] = sent[slot], sent[slot] + 1
            a.push_batch(slots, nos, _pcm(len(slots)))
            rows = np.bincount(slots, minlength=SLOTS)
            excess = np.maximum(0, count + rows - QUEUE) * (rows > 0)
            got = a.stats[:, _col("dropped")] - before[:, _col("dropped")]
            assert (got == excess).all(), f"a batch dropped {got}, the excess was {excess}"
            due.dropped += int(excess.sum())
        elif step[0] == "pack":
            _check_beat(a, inp, step[1], held, before, count, due)
        elif step[0] == "release":
            slot = held[step[1] % len(held)]
            queued = int(a.count[slot])
            stats = table.release(handles.pop(slot))
            del sent[slot]
            assert stats.dropped == before[slot, _col("dropped")] + queued, \
                "a release did not count exactly its queued frames as dropped"
            due.dropped += queued
        assert a.totals.underruns == due.underruns and a.totals.idle_frames == due.idle_frames
        assert a.totals.dropped - a.totals.shed == due.dropped, \
            "frames dropped other than by a full buffer, a release or shedding"


def _col(name: str) -> int:
    return list(SlotStats.__dataclass_fields__).index(name)


def _check_beat(a: ArrayScheduler, inp: BeatInput, ready, held: list[int], before: np.ndarray,
                count: np.ndarray, due: SlotStats) -> None:
    started = a.started.copy()
    plan = a.pack(inp, ready)
    want = [s for s in held if ready is None or s in ready]
    assert plan.slots == want, f"ready slots {sorted(set(want) - set(plan.slots))} not served"
    delta = a.stats - before
    under, idle, taken = _col("underruns"), _col("idle_frames"), _col("frames_in")
    for row, slot in enumerate(plan.slots):
        nums = plan.nums[row].tolist()
        if started[slot] or count[slot] >= PREBUFFER:
            have = min(FRAMES_PER_BEAT, int(count[slot]))
            assert delta[slot, taken] == have, "a queued frame was not taken"
            assert delta[slot, under] == FRAMES_PER_BEAT - have, \
                f"{delta[slot, under]} underruns counted with {count[slot]} frames queued"
            assert nums.count(SILENCE) == FRAMES_PER_BEAT - have
            assert delta[slot, idle] == 0
            due.underruns += FRAMES_PER_BEAT - have
        else:
            assert delta[slot, idle] == FRAMES_PER_BEAT and delta[slot, under] == 0, \
                "silence before the slot started counted as underruns"
            due.idle_frames += FRAMES_PER_BEAT
        for f, n in enumerate(nums):
            if n == SILENCE:
                assert not inp.audio[slot, f].any(), "an underrun row is not silence"
    assert (delta[:, _col("dropped")] == delta[:, _col("shed")]).all(), \
        "a beat dropped frames it did not shed"
    others = [s for s in held if s not in plan.slots]
    assert not delta[others].any(), "a slot not in the beat had its counters moved"


@settings(max_examples=300, deadline=None)
@given(STEPS)
def test_drops_and_underruns_only_where_due_one_for_one(run):
    """Catches: a frame thrown away (counted dropped) while the buffer had room; a batch that
    drops more than its excess; an underrun counted while a frame was queued (or frames left
    queued while silence is played); underruns counted before a slot started; the lowest ready
    slot never served; a release that loses queued frames uncounted."""
    check_jitter_accounting(*run)
