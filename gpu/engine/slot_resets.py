"""A beat's slot resets as one captured graph, where calls open at scattered slots.

A reset writes every tensor of a slot's state but the thinker's and the KV rows (~40 of them)
and copies the talker's warm-up in; the thinker's part is left to the prompt snapshot copied in
next, or reset apart where there is none. Over a run of consecutive slots that is ~40 fills of
views, whatever the run's length, which suits a fill (its opens take consecutive slots). Calls
that come and go open one or a few a beat at scattered slots, and each run then costs its ~40
launches while the device waits for the host. So on a GPU the same writes are captured once for
each count in COUNTS, by an index tensor of slots: the resets of a beat then cost one replay.

A count larger than the beat's resets is padded by repeating its last slot (`indexed_graphs`):
every write is a constant or the warm-up template, so a slot written twice holds what it holds
written once.

A slot whose session closed is cleaned behind a later beat's work (`clean`: the whole reset,
the thinker's part too, as one more captured graph), so the next session there starts with no
reset in its beat: a snapshot start is then its copy alone.
"""
from __future__ import annotations

import torch

import numpy as np

from gpu.engine.indexed_graphs import COUNTS, IndexedGraphs, padded
from gpu.engine.snapshot_rows import slot_runs
from gpu.model.voicechat import VoiceChat
from gpu.model.voicechat_state import VoiceChatState

__all__ = ["COUNTS", "SlotResets", "padded"]     # the counts captured (more resets: by runs)


class SlotResets:
    """The resets (less the thinker) and warm-ups of up to max(COUNTS) slots, by index writes:
    replayed from a capture per count (`capture`, on a GPU). `indexed` without a capture runs
    the same padded index writes eagerly (a CPU check of what the captures write)."""

    def __init__(self, state: VoiceChatState, model: VoiceChat, indexed: bool = False):
        self.state, self.model = state, model
        self.graphs = IndexedGraphs(self.write, indexed)
        self.cleans = IndexedGraphs(self.write_all, indexed)

    def write(self, slots: torch.Tensor | slice) -> None:
        """What a reset writes, but the thinker's part."""
        self.state.reset(slots, thinker=False)
        self.model.warm(self.state, slots)

    def write_all(self, slots: torch.Tensor | slice) -> None:
        """What a reset writes, the thinker's part too."""
        self.state.reset(slots)
        self.model.warm(self.state, slots)

    def capture(self, pool, slot: int, side: torch.cuda.Stream) -> None:
        """One graph per count and way, each warmed and captured on `slot` (a slot no session
        uses)."""
        for graphs in (self.graphs, self.cleans):
            graphs.capture(pool, lambda n: np.full(n, slot), self.state.text_prev.device, side)

    def clean(self, slots: list[int]) -> None:
        """`slots` (their sessions closed) wholly reset: one replay where a count holds them,
        else by runs."""
        count = self.cleans.count_for(len(slots))
        if count is not None:
            self.cleans.run(np.asarray(padded(slots, count)), self.state.text_prev.device)
            return
        for a, b, _ in slot_runs(slots):
            self.write_all(slice(a, b))

    def count_for(self, n: int) -> int | None:
        """The smallest captured count that holds n resets (None: none does)."""
        return self.graphs.count_for(n)

    def replay(self, slots) -> None:
        """`slots` (at most the largest captured count) reset, as `write` does."""
        index = np.asarray(padded(slots, self.count_for(len(slots))))
        self.graphs.run(index, self.state.text_prev.device)

    def run(self, resets, copied) -> None:
        """A plan's resets: by a captured graph where one holds them, else by runs; the thinker
        part of each slot that does not copy a snapshot in (`copied`) by runs."""
        if self.count_for(len(resets)) is not None:
            self.replay(resets)
            for a, b, _ in slot_runs([s for s in resets if s not in copied]):
                self.state.thinker.reset(slice(a, b))
            return
        for a, b, copies in slot_runs(resets, copied.__contains__):
            self.state.reset(slice(a, b), thinker=not copies)
            self.model.warm(self.state, slice(a, b))
