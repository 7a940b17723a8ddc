"""The array scheduler (`jitter_arrays.ArrayScheduler`, what the clock runs) against the plain
one (`jitter.BeatScheduler`, the reference): the same admissions, pushes (one at a time and in
worker batches), beats (some slots not ready, some beats still running when the next is packed
or when a slot is released and re-admitted) and releases, and at every step the same frames,
silences, counters, queues, shedding targets and routed outputs.

Catches, among others: a batch scatter that keeps the wrong frames when a batch overflows a
slot, a ring index that forgets to wrap, underruns counted
before a slot started, the shedding window's minimum taken over the wrong beats, a batch's samples read in pieces
written to the wrong places, a released and
re-admitted slot given its predecessor's outputs, counters carried over to a slot's next session.
"""
import numpy as np
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from wave_actors.core.contract import BeatInput
from wave_actors.core.frames import SAMPLES_IN
from wave_actors.core.sched.jitter import BeatScheduler, CapacityError, Shedding
from wave_actors.core.sched.frame_places import FrameStore
from wave_actors.core.sched.session_table import SessionTable

SLOTS = 4


def frame(slot_key: int, n: int) -> np.ndarray:
    return np.full(SAMPLES_IN, slot_key * 1000 + n + 1, np.float32)


class Lockstep(RuleBasedStateMachine):
    SHEDDING: Shedding | None = None

    def __init__(self):
        super().__init__()
        args = dict(prebuffer=3, max_queue=6, shedding=self.SHEDDING)
        # the array scheduler as the clock holds it: inside the session table, which admits
        self.ref, self.table = BeatScheduler(SLOTS, **args), SessionTable(SLOTS, **args)
        self.arr, self.handles = self.table.jitter, {}
        self.inp_ref, self.inp_arr = BeatInput.alloc(SLOTS), BeatInput.alloc(SLOTS)
        self.next_key = 0
        self.sent = {}            # slot -> frames pushed so far (the next frame's number)
        self.pending = []         # packed beats not yet completed: (ref plan, array plan)

    @rule()
    def admit(self):
        try:
            slot = self.ref.admit(self.next_key)
        except CapacityError:
            with pytest.raises(CapacityError):
                self.table.admit(self.next_key, None)
            return
        handle = self.table.admit(self.next_key, None)
        assert handle.slot == slot
        self.handles[slot] = handle
        self.sent[slot] = 0
        self.next_key += 1

    @precondition(lambda self: self.sent)
    @rule(data=st.data(), n=st.integers(1, 8))
    def push(self, data, n):
        slot = data.draw(st.sampled_from(sorted(self.sent)))
        for _ in range(n):
            pcm = frame(self.ref.slots[slot].key, self.sent[slot])
            self.ref.push(slot, self.sent[slot], pcm)
            self.arr.push(slot, self.sent[slot], pcm)
            self.sent[slot] += 1

    @precondition(lambda self: self.sent)
    @rule(data=st.data())
    def push_batch(self, data):
        """A worker's batch: rows of several slots interleaved, a slot's rows in order, up to
        more than a buffer holds."""
        order = data.draw(st.lists(st.sampled_from(sorted(self.sent)), min_size=1, max_size=16)
                          | st.lists(st.sampled_from(sorted(self.sent)), min_size=1,
                                     unique=True))
        slots, nos, pcm = [], [], []
        for slot in order:
            pcm.append(frame(self.ref.slots[slot].key, self.sent[slot]))
            self.ref.push(slot, self.sent[slot], pcm[-1])
            slots.append(slot)
            nos.append(self.sent[slot])
            self.sent[slot] += 1
        # Read as one message, or as several (the samples in pieces, as the clock reads them).
        cuts = data.draw(st.lists(st.integers(0, len(pcm)), max_size=3))
        pieces = np.split(np.stack(pcm), sorted(cuts))
        self.arr.push_batch(np.array(slots), np.array(nos), pieces if cuts else pieces[0])

    @precondition(lambda self: len(self.pending) < 2)
    @rule(data=st.data())
    def pack(self, data):
        ready = data.draw(st.none() | st.sets(st.integers(0, SLOTS - 1)))
        p_ref = self.ref.pack(self.inp_ref, ready)
        p_arr = self.arr.pack(self.inp_arr, ready)
        assert p_arr.beat == p_ref.beat
        assert sorted(p_ref.slots) == p_arr.slots
        assert p_arr.frames == p_ref.frames
        assert (self.inp_arr.live == self.inp_ref.live).all()
        s = p_arr.slots
        assert (self.inp_arr.audio[s] == self.inp_ref.audio[s]).all()
        self.pending.append((p_ref, p_arr))

    @precondition(lambda self: self.pending)
    @rule(late=st.booleans())
    def complete(self, late):
        p_ref, p_arr = self.pending.pop(0)
        routed = self.ref.complete(p_ref, late)
        slots, firsts = self.arr.complete(p_arr, late)
        assert dict(zip(slots.tolist(), firsts.tolist())) == {
            s: first for s, (_key, first) in routed.items()}
        assert all(self.table.entries[s].key == routed[s][0] for s in slots.tolist())

    @precondition(lambda self: self.sent)
    @rule(data=st.data())
    def release(self, data):
        slot = data.draw(st.sampled_from(sorted(self.sent)))
        assert self.table.release(self.handles.pop(slot)) == self.ref.release(slot)
        del self.sent[slot]
        with pytest.raises(KeyError):
            self.arr.push(slot, 0, frame(0, 0))

    @invariant()
    def same_state(self):
        assert self.arr.totals == self.ref.totals
        assert self.table.free_slots == self.ref.free_slots
        for slot, s in self.ref.slots.items():
            assert self.arr.queued(slot) == [f for f, _ in s.jitter]
            assert self.arr.slot_stats(slot) == s.stats
            assert self.arr.target(slot) == self.ref.target(slot)

    @invariant()
    def every_queued_frame_has_its_own_place(self):
        """Catches a place freed twice (two frames would share samples) or never (the store
        grows without bound), and the silent place handed out or written."""
        a = self.arr
        used = [p for slot in self.ref.slots
                for p in a.place[slot, (a.head[slot] + np.arange(a.count[slot])) % a.max_queue]]
        assert len(set(used)) == len(used) == a.store.in_use
        assert FrameStore.SILENT not in used and not a.store.pcm[FrameStore.SILENT].any()


class LockstepShedding(Lockstep):
    # A short window and a per-beat cap below a beat's frames, so shedding happens often and in
    # steps the batch rules above can overtake.
    SHEDDING = Shedding(window_s=0.5, keep=1, per_beat=1)


class LockstepSheddingDefault(Lockstep):
    SHEDDING = Shedding()


for machine in (Lockstep, LockstepShedding, LockstepSheddingDefault):
    machine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)

TestLockstep = pytest.mark.slow(Lockstep.TestCase)
TestLockstepShedding = pytest.mark.slow(LockstepShedding.TestCase)
# slow: the edit loop (make test-fast) runs the other two
TestLockstepSheddingDefault = pytest.mark.slow(LockstepSheddingDefault.TestCase)


def test_a_batch_larger_than_the_buffer_keeps_the_last_frames():
    table = SessionTable(2, prebuffer=3, max_queue=5, shedding=None)
    arr, slot = table.jitter, table.admit("a", None).slot
    arr.push_batch(np.full(8, slot), np.arange(8), np.stack([frame(0, n) for n in range(8)]))
    assert arr.queued(slot) == [3, 4, 5, 6, 7]
    assert arr.slot_stats(slot).dropped == 3 == arr.totals.dropped


def test_an_open_takes_the_lowest_preferred_free_slot_else_the_lowest_free():
    table = SessionTable(6, prebuffer=3, max_queue=5, shedding=None)
    handles = [table.admit(key, None) for key in "abcdef"]
    for slot in (1, 3, 4):
        table.release(handles[slot])
    assert table.admit("g", None, prefer=np.array([5, 4, 2])).slot == 4     # 5 and 2 are held
    assert table.admit("h", None, prefer=np.array([0, 2])).slot == 1    # none free: the lowest
    assert table.admit("i", None).slot == 3
    with pytest.raises(CapacityError):
        table.admit("j", None)
