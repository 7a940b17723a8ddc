"""Prompt snapshots on the device: rows of thinker state that sessions start from by a copy.

A start's state is a reset (the same for every session), the talker's warm-up (a fixed
template) and the prompt prefilled into the thinker: its Mamba SSM and conv states, its KV rows
[0, prompt) and its length. Only the thinker part differs by prompt, so a snapshot is a row of a
second `ThinkerState` with room for the prompt's positions (`max_prompt`), kept in the same
dtypes as the serving state: a copy in is bit for bit the state the prefill left. The slot book
(`wave_actors/core/sched/snapshots.py`) decides which rows hold what; this class only copies, in the
plan's order: `copy_in` right after the slots' resets, `save` after the beat's start rows.

A beat's copies go one of two ways. A few (calls coming and going start one or two a beat, at
scattered slots) go by `copy_rows` launches that read their slots, entries and lengths from the
device, captured once per count in COUNTS on a GPU: one replay, where slicing took five
launches a copy and the host's dispatch of them was most of what a lone start cost. More (a
fill) go by runs of consecutive slots, one broadcast copy a tensor a run.

Bytes per snapshot: fixed = ssm + conv of one slot; per position = one K and one V row of every
attention layer. A copy moves them once each way.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from gpu.engine.indexed_graphs import IndexedGraphs, padded
from gpu.kernels.row_copy import copy_rows
from gpu.model.thinker import ThinkerState
from gpu.model.voicechat_state import VoiceChatState
from wave_actors.core.sched.snapshots import SnapshotSpace


def space_for(state: VoiceChatState, capacity_bytes: float, salt: str) -> SnapshotSpace:
    th = state.thinker
    fixed = (th.ssm[:, 0].numel() * th.ssm.element_size()
             + th.conv[:, 0].numel() * th.conv.element_size())
    per_position = 2 * th.k[:, 0, 0].numel() * th.k.element_size()
    entries = int(capacity_bytes // (fixed + per_position * state.max_prompt)) \
        if capacity_bytes > 0 else 0
    return SnapshotSpace(entries, capacity_bytes, fixed, per_position, salt)


def model_salt(*parts) -> str:
    """What a snapshot's key must also name: the model (config, profile, dtypes, weights)."""
    return hashlib.blake2b(repr(parts).encode(), digest_size=8).hexdigest()


class SnapshotRows:
    """`indexed` without a capture runs the copies a capture would replay eagerly (a check,
    under Triton's interpreter on a CPU, of what the captures write)."""

    def __init__(self, state: VoiceChatState, space: SnapshotSpace, indexed: bool = False):
        th = state.thinker
        self.space, self.state = space, state
        self.rows = None
        # index [3, count]: slots, entries, positions
        self.graphs = IndexedGraphs(self._indexed, indexed and bool(space.entries))
        if space.entries:
            n, d = space.entries, th.k.device
            self.rows = ThinkerState(
                th.ssm.new_zeros(th.ssm.shape[0], n, *th.ssm.shape[2:]),
                th.conv.new_zeros(th.conv.shape[0], n, *th.conv.shape[2:]),
                th.k.new_zeros(th.k.shape[0], n, state.max_prompt, *th.k.shape[3:]),
                th.v.new_zeros(th.v.shape[0], n, state.max_prompt, *th.v.shape[3:]),
                torch.zeros(n, dtype=torch.long, device=d))

    def nbytes(self) -> int:
        if self.rows is None:
            return 0
        r = self.rows
        return sum(t.numel() * t.element_size() for t in (r.ssm, r.conv, r.k, r.v))

    @staticmethod
    def _rows(dst: ThinkerState, i: slice, src: ThinkerState, j: int, p: int) -> None:
        """Row j of `src` into the rows `i` of `dst` (one slot or a run of them), up to p
        positions of KV: plain strided copies, one block per layer and tensor, the source row
        broadcast over the run; a gather by an index tensor would build a temporary of every
        row first. The lengths are set by fills: nothing goes from the host to the device."""
        one = slice(j, j + 1)
        dst.ssm[:, i].copy_(src.ssm[:, one].expand_as(dst.ssm[:, i]))
        dst.conv[:, i].copy_(src.conv[:, one].expand_as(dst.conv[:, i]))
        dst.k[:, i, :p].copy_(src.k[:, one, :p].expand_as(dst.k[:, i, :p]))
        dst.v[:, i, :p].copy_(src.v[:, one, :p].expand_as(dst.v[:, i, :p]))
        dst.length[i] = p

    def _indexed(self, index: torch.Tensor) -> None:
        """index [3, n] on the device: slots, entries, positions; every copy by device rows."""
        th, src = self.state.thinker, self.rows
        slots, entries, positions = index[0], index[1], index[2]
        copy_rows(th.ssm, slots, src.ssm, entries)
        copy_rows(th.conv, slots, src.conv, entries)
        copy_rows(th.k, slots, src.k, entries, positions)
        copy_rows(th.v, slots, src.v, entries, positions)
        th.length.index_copy_(0, slots, positions)

    def capture(self, pool, slot: int, side: torch.cuda.Stream) -> None:
        """One graph per count, each warmed and captured copying entry 0 into `slot` (a slot
        no session uses)."""
        if self.space.entries:
            self.graphs.capture(pool, lambda n: np.array([[slot] * n, [0] * n, [1] * n]),
                                self.state.thinker.length.device, side)

    def count_for(self, n: int) -> int | None:
        """The smallest captured count that holds n copies (None: none does)."""
        return self.graphs.count_for(n)

    def copy_in(self, copies: list[tuple[int, int, int]]) -> None:
        """(slot, entry, positions): the entry's state into the slot (after its reset); the
        slot's length says where its cache ends, and nothing reads past it. A few copies: one
        captured replay (padded by the last copy again, which writes what it wrote); more:
        consecutive slots copying the same entry (a fill: many opens of one prompt) take one
        copy."""
        if not copies:
            return
        count = self.count_for(len(copies))
        if count is not None:
            index = np.ascontiguousarray(np.array(padded(copies, count)).T)   # [3, count]
            self.graphs.run(index, self.state.thinker.length.device)
            return
        source = {slot: (entry, positions) for slot, entry, positions in copies}
        for a, b, (entry, positions) in slot_runs(source, source.get):
            self._rows(self.state.thinker, slice(a, b), self.rows, entry, positions)

    def save(self, saves: list[tuple[int, int, int]]) -> None:
        """(slot, entry, positions): the slot's thinker state (its rows just ran up to
        `positions`) kept in the entry."""
        for slot, entry, positions in saves:
            self._rows(self.rows, slice(entry, entry + 1), self.state.thinker, slot, positions)


def slot_runs(slots, key=lambda slot: None) -> list[tuple[int, int, object]]:
    """Sorted `slots` as runs [a, b) of consecutive slots with the same key(slot): the unit
    a reset or a copy fills as one view."""
    runs: list[list] = []
    for slot in sorted(slots):
        k = key(slot)
        if runs and runs[-1][1] == slot and runs[-1][2] == k:
            runs[-1][1] = slot + 1
        else:
            runs.append([slot, slot + 1, k])
    return [tuple(r) for r in runs]
