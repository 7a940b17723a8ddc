"""Where a new call goes: placement policies over the nodes that can take it.

A policy sees only the nodes that are alive, not draining and have a free slot (the directory
filters them), and picks one. Slots are counted by the directory the moment a call is placed,
so every policy reads exact free-slot counts; a node's beat headroom (the milliseconds its beat
has left at its live count) comes from its last load report and may be a few seconds old.

- `most_free`: the node with the most free slots, ties by headroom then name. Exact balance,
  O(log nodes) a placement (the open nodes are kept in a heap).
- `two_choices`: two nodes drawn at random, the one with more free slots (the power of two
  choices): near `most_free`'s balance for O(1) a placement, and two entry points placing at
  once rarely pick the same node.
- `random`: one node at random; the baseline the others are measured against.
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from typing import Iterator, Protocol


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


def _key(node: NodeLoad) -> tuple:
    """Better first: more free slots, then more headroom, then the first name."""
    return (-node.free, -node.headroom_ms, node.name)


class OpenNodes:
    """The nodes that take calls (alive, not draining, a slot free), kept for placement as the
    directory changes them: one drawn at random in O(1), the best by `_key` in O(log n) (a heap
    whose entries a later change made stale are dropped when they reach the top)."""

    def __init__(self):
        self._nodes: list[NodeLoad] = []
        self._at: dict[str, int] = {}
        self._version: dict[str, int] = {}
        self._heap: list[tuple] = []

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[NodeLoad]:
        return iter(self._nodes)

    def update(self, node: NodeLoad, takes_calls: bool) -> None:
        """`node` changed (a call placed or closed, a report, a drain, a loss, a join)."""
        version = self._version[node.name] = self._version.get(node.name, 0) + 1
        if not takes_calls:
            self._remove(node.name)
            return
        if node.name not in self._at:
            self._at[node.name] = len(self._nodes)
            self._nodes.append(node)
        self._nodes[self._at[node.name]] = node
        heapq.heappush(self._heap, (*_key(node), version))
        if len(self._heap) > 4 * len(self._nodes) + 64:        # stale entries bounded
            self._heap = [(*_key(n), self._version[n.name]) for n in self._nodes]
            heapq.heapify(self._heap)

    def _remove(self, name: str) -> None:
        i = self._at.pop(name, None)
        if i is None:
            return
        last = self._nodes.pop()
        if i < len(self._nodes):
            self._nodes[i] = last
            self._at[last.name] = i

    def best(self) -> NodeLoad:
        while True:
            *_, name, version = self._heap[0]
            if name in self._at and self._version[name] == version:
                return self._nodes[self._at[name]]
            heapq.heappop(self._heap)

    def draw(self, k: int, rng: random.Random) -> list[NodeLoad]:
        return [self._nodes[i] for i in rng.sample(range(len(self._nodes)), k)]


class Placement(Protocol):
    name: str

    def pick(self, nodes: OpenNodes, rng: random.Random) -> NodeLoad:
        """One of `nodes` (never empty; each has a free slot)."""


class MostFree:
    name = "most_free"

    def pick(self, nodes: OpenNodes, rng: random.Random) -> NodeLoad:
        return nodes.best()


class TwoChoices:
    name = "two_choices"

    def pick(self, nodes: OpenNodes, rng: random.Random) -> NodeLoad:
        if len(nodes) == 1:
            return nodes.draw(1, rng)[0]
        return min(nodes.draw(2, rng), key=_key)


class Anywhere:
    name = "random"

    def pick(self, nodes: OpenNodes, rng: random.Random) -> NodeLoad:
        return nodes.draw(1, rng)[0]


POLICIES: dict[str, type] = {p.name: p for p in (MostFree, TwoChoices, Anywhere)}
DEFAULT = "most_free"


def policy(name: str) -> Placement:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown placement {name!r}; known: {sorted(POLICIES)}") from None
