"""The prompt-snapshot index: which prompts' start states an executor keeps, and where.

A session's start (its system prompt prefilled into the thinker; every other part of its state is
a reset, the talker's warm-up a fixed template) depends only on the prompt's tokens and the
model. So the first session with a prompt prefills it in start rows and the executor then keeps
the slot's thinker state as a snapshot in one of its `entries` snapshot rows; every later session
with that prompt starts by one device copy of that row into its slot. Keys hash the prompt's
tokens with the executor's `salt` (its config, profile and dtypes), so a snapshot never serves a
model it was not made by.

Prefixes: a Mamba state exists only at the positions a prefill stopped at, so a snapshot of a
prefix is kept when one is seen to be shared. A prompt that misses but shares at least one
prefill chunk with a kept or pending prompt (the same system prompt, other tools) keeps, as its
rows pass it, a snapshot at the last chunk boundary of that shared prefix; later prompts with that
prefix copy it and prefill only the rest.

Bounded: at most `entries` snapshots and `capacity_bytes` bytes (`bytes_of(positions)`: what a
snapshot of that many positions holds), least recently used first out. An entry copied from in a
beat may be overwritten by a save later in the same beat: the executor runs a plan's copies
before its rows and its saves after them.

Torch-free and clock-free: the slot book owns one index and puts its copies and saves in plans.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class Snapshot:
    entry: int          # the executor's snapshot row
    positions: int      # thinker positions it holds (the prompt, or a chunk-aligned prefix)
    nbytes: int
    tokens: tuple       # what it holds, to find shared prefixes


class SnapshotIndex:
    def __init__(self, entries: int, capacity_bytes: float, bytes_of: Callable[[int], int],
                 chunk: int, salt: str = ""):
        if entries < 0 or capacity_bytes < 0 or chunk < 1:
            raise ValueError("SnapshotIndex: entries >= 0, capacity_bytes >= 0, chunk >= 1")
        self.entries, self.capacity_bytes = entries, capacity_bytes
        self.bytes_of, self.chunk, self.salt = bytes_of, chunk, salt
        self._kept: OrderedDict[str, Snapshot] = OrderedDict()    # key → snapshot, oldest use first
        self._free = list(range(entries - 1, -1, -1))
        self.pending: dict[str, int] = {}            # key → the slot whose rows will make it
        self.hits = self.prefix_hits = self.misses = self.saves = self.evictions = 0

    @property
    def enabled(self) -> bool:
        return self.entries > 0 and self.capacity_bytes > 0

    def key(self, tokens) -> str:
        h = hashlib.blake2b(self.salt.encode(), digest_size=16)
        h.update(np.asarray(tokens, np.int64).tobytes())
        return h.hexdigest()

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._kept.values())

    def __len__(self) -> int:
        return len(self._kept)

    def find(self, tokens, count: bool = True) -> Snapshot | None:
        """The snapshot of the whole prompt, else of its longest kept chunk-aligned prefix;
        None when neither is kept. With `count`, marks it used and counts a hit, a prefix hit
        or a miss (without: a look that changes nothing)."""
        if not self.enabled:
            return None
        whole = self._kept.get(self.key(tokens))
        if whole is not None:
            if count:
                self._kept.move_to_end(self.key(tokens))
                self.hits += 1
            return whole
        for p in range((len(tokens) - 1) // self.chunk * self.chunk, 0, -self.chunk):
            k = self.key(tokens[:p])
            if k in self._kept:
                if count:
                    self._kept.move_to_end(k)
                    self.prefix_hits += 1
                return self._kept[k]
        if count:
            self.misses += 1
        return None

    def hold(self, tokens) -> bool:
        """Whether the whole prompt's snapshot is kept; if so it becomes the most recently
        used (a start promised on it is not undone by the next eviction). Counts nothing."""
        key = self.key(tokens)
        if not self.enabled or key not in self._kept:
            return False
        self._kept.move_to_end(key)
        return True

    def fits(self, positions: int) -> bool:
        """Whether a snapshot of this many positions can be kept at all."""
        return self.enabled and self.bytes_of(positions) <= self.capacity_bytes

    def kept(self, tokens) -> bool:
        return self.key(tokens) in self._kept

    def shared_prefix(self, tokens, others=()) -> int:
        """The last chunk boundary inside the longest prefix `tokens` shares with a kept prompt
        or one of `others` (prompts being prefilled); 0: none worth keeping. Only a miss asks,
        so a scan of the kept prompts is cheap."""
        best = 0
        for theirs in [s.tokens for s in self._kept.values()] + list(others):
            n = min(len(theirs), len(tokens) - 1)
            same = np.flatnonzero(np.asarray(theirs[:n]) != np.asarray(tokens[:n]))
            best = max(best, int(same[0]) if len(same) else n)
        return best // self.chunk * self.chunk

    def reserve(self, tokens) -> Snapshot | None:
        """A row for the snapshot of `tokens` (a whole prompt or a prefix), evicting the least
        recently used until it fits; None when it cannot fit at all or is kept already."""
        if not self.enabled or self.kept(tokens):
            return None
        if not self.fits(len(tokens)):
            return None
        nbytes = self.bytes_of(len(tokens))
        while self._kept and (not self._free or self.nbytes + nbytes > self.capacity_bytes):
            _, old = self._kept.popitem(last=False)
            self._free.append(old.entry)
            self.evictions += 1
        snap = Snapshot(self._free.pop(), len(tokens), nbytes, tuple(tokens))
        self._kept[self.key(tokens)] = snap
        self.saves += 1
        return snap

    def describe(self) -> dict:
        return {"entries": self.entries, "capacity_bytes": int(self.capacity_bytes),
                "kept": len(self._kept), "bytes": self.nbytes, "hits": self.hits,
                "prefix_hits": self.prefix_hits, "misses": self.misses, "saves": self.saves,
                "evictions": self.evictions}


@dataclass(frozen=True)
class SnapshotSpace:
    """What an executor sets aside for prompt snapshots: `entries` rows of up to its prompt's
    positions, `capacity_bytes` in all; a snapshot of p positions holds `fixed_bytes` (the
    Mamba states) + p × `bytes_per_position` (the prompt's KV rows)."""
    entries: int
    capacity_bytes: float
    fixed_bytes: int
    bytes_per_position: int
    salt: str

    def bytes_of(self, positions: int) -> int:
        return self.fixed_bytes + positions * self.bytes_per_position

    def index(self, chunk: int) -> SnapshotIndex:
        return SnapshotIndex(self.entries, self.capacity_bytes, self.bytes_of, chunk, self.salt)


def snapshot_index(executor, chunk: int) -> SnapshotIndex | None:
    """The index a slot book keeps for `executor`'s snapshots (None: it keeps none)."""
    space = getattr(executor, "snapshot_space", None)
    return None if space is None or space.entries < 1 else space.index(chunk)
