"""A beat's resets and snapshot copies run over runs of consecutive slots (plain fills and
broadcast copies of views), or, on a GPU, by one captured graph each of padded index writes
and device-indexed row copies. Each way must write exactly what a per-slot reset and copy
write, and nothing else.

Bugs these catch: a run that reaches one slot too far (a neighbour's state zeroed mid-call);
a copy-start whose thinker part is left stale because the reset skipped it and the copy missed
it; a reset that skips the thinker of a slot that does not copy in this plan (it would prefill
onto the last session's SSM state); a run merged across two different snapshot entries; a
padded index whose padding names a slot that no reset was asked for; a captured copy that
replays the positions or entry it was captured with instead of the beat's; a clean (a closed
slot reset behind a beat) that leaves the thinker's part, or the talker's warm-up, stale.
"""
import os

import pytest
import numpy as np
import torch
from hypothesis import given, settings, strategies as st

from gpu.engine.slot_resets import COUNTS, SlotResets, padded
from gpu.engine.snapshot_rows import SnapshotRows, slot_runs
from gpu.model.config import Profile, VoiceChatConfig
from gpu.model.voicechat import VoiceChat
from wave_actors.core.sched.snapshots import SnapshotSpace

SLOTS, PROMPT, CONTEXT = 8, 32, 16
MODEL = VoiceChat.random(VoiceChatConfig.named("tiny"), Profile.named("fp32"), "cpu", 0)


def noisy_state(seed: int):
    """Every slot's every tensor filled with numbers no reset writes."""
    state = MODEL.alloc_state(SLOTS, CONTEXT, PROMPT)
    g = torch.Generator().manual_seed(seed)
    for _, t in state.tensors():
        if t.is_floating_point():
            t.copy_(torch.rand(t.shape, generator=g) + 5)
        else:
            t.copy_(torch.randint(7, 99, t.shape, generator=g).to(t.dtype))
    return state


def snapshot_rows(state, entries: int = 2, indexed: bool = False) -> SnapshotRows:
    rows = SnapshotRows(state, SnapshotSpace(entries, 1e9, 1, 1, "test"), indexed=indexed)
    g = torch.Generator().manual_seed(99)
    for t in (rows.rows.ssm, rows.rows.conv, rows.rows.k, rows.rows.v):
        t.copy_(torch.rand(t.shape, generator=g) - 3)
    return rows


def by_slot(state) -> dict[str, torch.Tensor]:
    """Each tensor with its slot axis first (the thinker's and perception's lead with layers)."""
    out = {}
    for name, t in state.tensors():
        slot_axis = 1 if name.split(".")[0] in ("thinker", "perception") and \
            name.split(".")[1] in ("ssm", "conv", "k", "v", "time") else 0
        out[name] = t.movedim(slot_axis, 0).clone()
    return out


# every count of resets alike (a set strategy favours the smallest), so the padded counts
# (3, 5, 6, 7 resets) come up often enough for the search to find a padding bug
@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(resets=st.integers(1, SLOTS).flatmap(
           lambda n: st.permutations(range(SLOTS)).map(lambda p: set(p[:n]))),
       copy_entry=st.lists(st.sampled_from([None, 0, 1]), min_size=SLOTS, max_size=SLOTS),
       positions=st.integers(1, PROMPT), indexed=st.booleans())
@pytest.mark.slow
def test_resets_write_what_per_slot_resets_and_copies_write(resets, copy_entry, positions,
                                                            indexed):
    copies = [(s, copy_entry[s], positions) for s in sorted(resets) if copy_entry[s] is not None]
    # the plain way: every reset slot by an index tensor, its whole state; then each copy
    want = noisy_state(0)
    rows = snapshot_rows(want)
    idx = torch.tensor(sorted(resets))
    want.reset(idx)
    MODEL.warm(want, idx)
    for slot, entry, p in copies:
        th, src = want.thinker, rows.rows
        th.ssm[:, slot] = src.ssm[:, entry]
        th.conv[:, slot] = src.conv[:, entry]
        th.k[:, slot, :p] = src.k[:, entry, :p]
        th.v[:, slot, :p] = src.v[:, entry, :p]
        th.length[slot] = p
    # as ModelRunner.reset_slots and SnapshotRows.copy_in do them: by runs, or by the padded
    # index writes a GPU executor captures
    got = noisy_state(0)
    # the indexed copies are Triton launches: CPU tensors need the interpreter (a GPU
    # machine checks them captured, below)
    got_rows = snapshot_rows(got, indexed=indexed and os.environ.get("TRITON_INTERPRET") == "1")
    SlotResets(got, MODEL, indexed=indexed).run(sorted(resets), {s for s, _, _ in copies})
    got_rows.copy_in(copies)
    w, g = by_slot(want), by_slot(got)
    for name in w:
        assert torch.equal(w[name], g[name]), name


@settings(max_examples=40, deadline=None)
@given(cleans=st.integers(1, SLOTS).flatmap(
           lambda n: st.permutations(range(SLOTS)).map(lambda p: sorted(p[:n]))),
       indexed=st.booleans())
def test_a_clean_writes_what_a_whole_per_slot_reset_writes(cleans, indexed):
    want = noisy_state(1)
    idx = torch.tensor(cleans)
    want.reset(idx)
    MODEL.warm(want, idx)
    got = noisy_state(1)
    SlotResets(got, MODEL, indexed=indexed).clean(cleans)
    w, g = by_slot(want), by_slot(got)
    for name in w:
        assert torch.equal(w[name], g[name]), name


def test_runs_split_where_the_key_changes():
    assert slot_runs([5, 1, 2, 3, 7]) == [(1, 4, None), (5, 6, None), (7, 8, None)]
    key = {1: "a", 2: "a", 3: "b", 4: "b"}.get
    assert slot_runs([1, 2, 3, 4], key) == [(1, 3, "a"), (3, 5, "b")]
    assert slot_runs(np.array([], int)) == []


def test_padding_repeats_the_last_slot_asked_for():
    assert padded([5, 2], 4) == [2, 5, 5, 5]
    assert padded([3], 1) == [3]
    r = SlotResets(noisy_state(0), MODEL, indexed=True)
    assert [r.count_for(n) for n in (1, 2, 3, 5, 16)] == [1, 2, 4, 8, 16]
    assert r.count_for(max(COUNTS) + 1) is None            # more: by runs


@pytest.mark.gpu
def test_captured_resets_write_what_eager_ones_write():
    """The captured graphs (index writes into a slot named at replay) against the eager
    resets and cleans, on the device, for scattered slots of every captured count."""
    cuda = VoiceChat.random(VoiceChatConfig.named("tiny"), Profile.named("fp32"), "cuda", 0)
    n_slots = 2 * max(COUNTS) + 1
    trash = n_slots - 1
    for n in COUNTS:
        slots = list(range(0, 2 * n, 2))
        states = []
        for captured in (True, False):
            state = cuda.alloc_state(n_slots, CONTEXT, PROMPT)
            for _, t in state.tensors():
                t.fill_(7)
            r = SlotResets(state, cuda, indexed=not captured)
            if captured:
                r.capture(None, trash, torch.cuda.Stream())
                for _, t in state.tensors():    # the capture's warm-up wrote the trash slot
                    t.fill_(7)
            r.run(slots, set())
            r.clean([s + 1 for s in slots])
            states.append(by_slot(state))
        for name in states[0]:
            assert torch.equal(states[0][name], states[1][name]), (n, name)


@pytest.mark.gpu
def test_captured_copies_write_what_eager_ones_write():
    """The captured copy graphs (slots, entries and positions read from the device at replay)
    against the copies by runs, on the device, for scattered slots of every captured count."""
    cuda = VoiceChat.random(VoiceChatConfig.named("tiny"), Profile.named("fp32"), "cuda", 0)
    n_slots = 2 * max(COUNTS) + 1
    trash = n_slots - 1
    for n in COUNTS:
        copies = [(2 * i, i % 2, 1 + (5 * i) % PROMPT) for i in range(n)]
        states = []
        for captured in (True, False):
            state = cuda.alloc_state(n_slots, CONTEXT, PROMPT)
            for _, t in state.tensors():
                t.fill_(7)
            rows = SnapshotRows(state, SnapshotSpace(2, 1e9, 1, 1, "test"))
            for k, t in enumerate((rows.rows.ssm, rows.rows.conv, rows.rows.k, rows.rows.v)):
                t.copy_(torch.arange(t.numel(), device="cuda").view(t.shape) % 97 - k)
            if captured:
                rows.capture(None, trash, torch.cuda.Stream())
                assert rows.count_for(n) == n
                for _, t in state.tensors():    # the capture's warm-up wrote the trash slot
                    t.fill_(7)
            rows.copy_in(copies)
            states.append(by_slot(state))
        for name in states[0]:
            assert torch.equal(states[0][name], states[1][name]), (n, name)
