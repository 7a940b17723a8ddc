"""Which starting slots take a beat's start rows: a queue in open order, a row a slot a beat.
Bookkeeping shared by the slot books of every executor and the simulator (no torch, no clock);
the start policies (`start_policy.py`) decide how many rows a beat carries.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Start:
    order: int                      # open order: the oldest starts take the rows first
    chunks: int = 0                 # prompt chunks run
    done: bool = False              # its prompt is in; it goes live from the next beat


class StartQueue:
    """Which starting slots take a beat's start rows: each slot at most one row a beat (its next
    chunk follows the one before), the oldest starts first. Bookkeeping shared by every
    executor and the simulator."""

    def __init__(self) -> None:
        self._starts: dict[int, _Start] = {}       # slot → its start, from open to live or close
        self._opens = 0

    def open(self, slot: int) -> None:
        self._opens += 1
        self._starts[slot] = _Start(self._opens)

    def close(self, slot: int) -> None:
        self._starts.pop(slot, None)

    @property
    def running(self) -> int:
        return sum(not s.done for s in self._starts.values())

    def plan(self, rows: int) -> list[int]:
        """The slots that take this beat's `rows` start rows, oldest first."""
        running = sorted((s.order, slot) for slot, s in self._starts.items() if not s.done)
        chosen = [slot for _, slot in running[:rows]]
        for slot in chosen:
            self._starts[slot].chunks += 1
        return chosen

    def finished(self, slot: int) -> None:
        self._starts[slot].done = True

    def going_live(self) -> list[int]:
        """Finished starts, oldest first; they leave the queue."""
        done = sorted((s.order, slot) for slot, s in self._starts.items() if s.done)
        for _, slot in done:
            del self._starts[slot]
        return [slot for _, slot in done]
