"""Prompt snapshots on the device: rows of thinker state that sessions start from by a copy.

A start's state is a reset (the same for every session), the talker's warm-up (a fixed
template) and the prompt prefilled into the thinker: its Mamba SSM and conv states, its KV rows
[0, prompt) and its length. Only the thinker part differs by prompt, so a snapshot is a row of a
second `ThinkerState` with room for the prompt's positions (`max_prompt`), kept in the same
dtypes as the serving state: a copy in is bit for bit the state the prefill left. The slot book
(`wave_actors/core/snapshots.py`) decides which rows hold what; this class only copies, in the
plan's order: `copy_in` right after the slots' resets, `save` after the beat's start rows.

Bytes per snapshot: fixed = ssm + conv of one slot; per position = one K and one V row of every
attention layer. A copy moves them once each way.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from gpu.model.thinker import ThinkerState
from gpu.model.voicechat_state import VoiceChatState
from wave_actors.core.snapshots import SnapshotSpace


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
    def __init__(self, state: VoiceChatState, space: SnapshotSpace):
        th = state.thinker
        self.space, self.state = space, state
        self.rows = None
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

    def _lengths(self, pairs: list[tuple[int, int, int]]):
        dev = self.state.thinker.k.device
        a = np.asarray(pairs, np.int64)
        return torch.as_tensor(a[:, 0], device=dev), torch.as_tensor(a[:, 1], device=dev), \
            torch.as_tensor(a[:, 2], device=dev)

    @staticmethod
    def _rows(dst: ThinkerState, i: int, src: ThinkerState, j: int, p: int) -> None:
        """Row j of `src` into row i of `dst`, up to p positions of KV: a plain strided copy a
        tensor (one block per layer), which streams at the copy rate where a gather by an index
        tensor builds a temporary of every row first."""
        dst.ssm[:, i].copy_(src.ssm[:, j])
        dst.conv[:, i].copy_(src.conv[:, j])
        dst.k[:, i, :p].copy_(src.k[:, j, :p])
        dst.v[:, i, :p].copy_(src.v[:, j, :p])

    def copy_in(self, copies: list[tuple[int, int, int]]) -> None:
        """(slot, entry, positions): the entry's state into the slot (after its reset); the
        slot's length says where its cache ends, and nothing reads past it."""
        if not copies:
            return
        for slot, entry, positions in copies:
            self._rows(self.state.thinker, slot, self.rows, entry, positions)
        slots, _, positions = self._lengths(copies)
        self.state.thinker.length[slots] = positions

    def save(self, saves: list[tuple[int, int, int]]) -> None:
        """(slot, entry, positions): the slot's thinker state (its rows just ran up to
        `positions`) kept in the entry."""
        if not saves:
            return
        for slot, entry, positions in saves:
            self._rows(self.rows, entry, self.state.thinker, slot, positions)
        _, entries, positions = self._lengths(saves)
        self.rows.length[entries] = positions
