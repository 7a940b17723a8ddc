"""Task tables per batch bucket (issue 18, stage 2): a stage lowered once for each bucket of
sessions, as the graph executor captures one graph a bucket, so a beat with n live sessions
runs the smallest table that holds them (its spare rows on a spare slot, as the graph's do).

Every bucket's table places the stage's weights, slot state and constants at the same
offsets (the arena's batch-independent prefix, `Lowered.fixed`; the GEMM weights' arena is
the same too): one arena and one weight arena serve them all, and the state a beat of one
bucket writes is what the next beat reads, whichever bucket it runs. Inputs and activations
follow the prefix, each table its own layout; each table has its own counters and its own
launch count (its beats, the counters' epoch).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from gpu.wpk.ir import Graph, Storage
from gpu.wpk.lower import Lowered, lower


@dataclass
class BucketTables:
    tables: dict                # bucket → Lowered

    def pick(self, n: int) -> int:
        """The smallest bucket that holds n sessions."""
        for b in sorted(self.tables):
            if b >= n:
                return b
        raise ValueError(f"{n} sessions: the largest bucket is {max(self.tables)}")

    @property
    def arena(self) -> int:
        return max(t.arena for t in self.tables.values())

    def load(self, tensors: dict, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(arena, weights) for every bucket, holding the batch-independent tensors of
        `tensors` (weights, slot state) at their shared places."""
        big = self.tables[max(self.tables)]
        arena, weights = big.load(tensors, device)
        return torch.cat([arena, arena.new_zeros(self.arena - arena.numel())]), weights


def _prefix(low: Lowered) -> list:
    """The batch-independent storages' places, in order, by name where they have one."""
    g = low.graph
    names = {g.values[vid].storage: name for name, vid in g.named.items()}
    return [(names.get(sid, g.storages[sid].kind.value), place)
            for sid, place in sorted(low.places.items(), key=lambda kv: kv[1])
            if g.storages[sid].kind in (Storage.WEIGHT, Storage.STATE, Storage.CONSTANT)]


def lower_buckets(graph_at: Callable[[int], Graph], buckets, programs: int,
                  weight_dtype: torch.dtype | None = None) -> BucketTables:
    """The stage traced at each bucket (`graph_at(b)`), lowered for `programs` programs; its
    batch-independent places must agree across buckets (a stage whose weights or state
    change with the batch is refused)."""
    tables = {b: lower(graph_at(b), b, programs, weight_dtype) for b in sorted(set(buckets))}
    first = tables[min(tables)]
    for b, low in tables.items():
        if (low.fixed, low.weights, _prefix(low)) != (first.fixed, first.weights, _prefix(first)):
            raise ValueError(f"bucket {b}: its weights, state or constants lie elsewhere than "
                             f"bucket {min(tables)}'s: the tables cannot share an arena")
    return BucketTables(tables)
