"""A beat's resets and snapshot copies run over runs of consecutive slots (plain fills and
broadcast copies of views, no index kernels). They must write exactly what a per-slot reset
and copy write, and nothing else.

Bugs these catch: a run that reaches one slot too far (a neighbour's state zeroed mid-call);
a copy-start whose thinker part is left stale because the reset skipped it and the copy missed
it; a reset that skips the thinker of a slot that does not copy in this plan (it would prefill
onto the last session's SSM state); a run merged across two different snapshot entries.
"""
import numpy as np
import torch
from hypothesis import given, settings, strategies as st

from gpu.engine.snapshot_rows import SnapshotRows, slot_runs
from gpu.model.config import Profile, VoiceChatConfig
from gpu.model.voicechat import VoiceChat
from wave_actors.core.snapshots import SnapshotSpace

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


def snapshot_rows(state, entries: int = 2) -> SnapshotRows:
    rows = SnapshotRows(state, SnapshotSpace(entries, 1e9, 1, 1, "test"))
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


@settings(max_examples=25, deadline=None)
@given(resets=st.sets(st.integers(0, SLOTS - 1), min_size=1),
       copy_entry=st.lists(st.sampled_from([None, 0, 1]), min_size=SLOTS, max_size=SLOTS),
       positions=st.integers(1, PROMPT))
def test_runs_write_what_per_slot_resets_and_copies_write(resets, copy_entry, positions):
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
    # the runs, as ModelRunner.reset_slots and SnapshotRows.copy_in do them
    got = noisy_state(0)
    got_rows = snapshot_rows(got)
    copied = {slot for slot, _, _ in copies}
    for a, b, is_copied in slot_runs(resets, copied.__contains__):
        got.reset(slice(a, b), thinker=not is_copied)
        MODEL.warm(got, slice(a, b))
    got_rows.copy_in(copies)
    w, g = by_slot(want), by_slot(got)
    for name in w:
        assert torch.equal(w[name], g[name]), name


def test_runs_split_where_the_key_changes():
    assert slot_runs([5, 1, 2, 3, 7]) == [(1, 4, None), (5, 6, None), (7, 8, None)]
    key = {1: "a", 2: "a", 3: "b", 4: "b"}.get
    assert slot_runs([1, 2, 3, 4], key) == [(1, 3, "a"), (3, 5, "b")]
    assert slot_runs(np.array([], int)) == []
