"""Where a new call goes: placement policies over the nodes that can take it.

A policy sees only the nodes that are alive, not draining and have a free slot (the directory
filters them), and picks one. Slots are counted by the directory the moment a call is placed,
so every policy reads exact free-slot counts; a node's beat headroom (the milliseconds its beat
has left at its live count) comes from its last load report and may be a few seconds old.

- `most_free`: the node with the most free slots, ties by headroom then name. Exact balance,
  O(nodes) a placement.
- `two_choices`: two nodes drawn at random, the one with more free slots (the power of two
  choices): near `most_free`'s balance for O(1) a placement, and two entry points placing at
  once rarely pick the same node.
- `random`: one node at random; the baseline the others are measured against.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol, Sequence


@dataclass
class NodeLoad:
    """What placement weighs of one node."""
    name: str
    slots: int
    used: int = 0                   # calls placed there and not yet closed
    headroom_ms: float = 0.0        # the beat's time left at its live count, last reported

    @property
    def free(self) -> int:
        return self.slots - self.used


class Placement(Protocol):
    name: str

    def pick(self, nodes: Sequence[NodeLoad], rng: random.Random) -> NodeLoad:
        """One of `nodes` (never empty; each has a free slot)."""


def _score(node: NodeLoad) -> tuple:
    return (node.free, node.headroom_ms, node.name)


class MostFree:
    name = "most_free"

    def pick(self, nodes: Sequence[NodeLoad], rng: random.Random) -> NodeLoad:
        return max(nodes, key=_score)


class TwoChoices:
    name = "two_choices"

    def pick(self, nodes: Sequence[NodeLoad], rng: random.Random) -> NodeLoad:
        if len(nodes) == 1:
            return nodes[0]
        a, b = rng.sample(range(len(nodes)), 2)
        return max(nodes[a], nodes[b], key=_score)


class Anywhere:
    name = "random"

    def pick(self, nodes: Sequence[NodeLoad], rng: random.Random) -> NodeLoad:
        return nodes[rng.randrange(len(nodes))]


POLICIES: dict[str, type] = {p.name: p for p in (MostFree, TwoChoices, Anywhere)}
DEFAULT = "most_free"


def policy(name: str) -> Placement:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown placement {name!r}; known: {sorted(POLICIES)}") from None
