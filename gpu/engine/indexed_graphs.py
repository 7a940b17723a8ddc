"""Beat work that reads its rows from a device index, captured once per count and replayed.

Slot resets and snapshot copies of calls that come and go touch one or a few scattered slots a
beat; launched op by op, the device waits on the host's dispatch. Written against an index
tensor on the device, the same work is captured once for each count in COUNTS and a beat's
rows cost one host-to-device copy of the index and one replay. A count larger than the rows
asked is padded by repeating the last row: the work must write, for a row given twice, what it
writes for it once.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

COUNTS = (1, 2, 4, 8, 16)       # the counts captured; more rows in a beat: the caller's own way


def padded(items, count: int) -> list:
    """Sorted `items`, the last repeated up to `count`."""
    s = sorted(items)
    return s + s[-1:] * (count - len(s))


class IndexedGraphs:
    """`work(index)` for every count in COUNTS. `indexed` without a capture runs the same padded
    index work eagerly (a check, on a CPU, of what the captures write)."""

    def __init__(self, work: Callable[[torch.Tensor], None], indexed: bool = False):
        self.work = work
        self.counts: tuple[int, ...] = COUNTS if indexed else ()
        # count → (graph, the device index it reads, its pinned host twin, the event past the
        # twin's last copy to the device)
        self.graphs: dict[int, tuple] = {}

    def capture(self, pool, index_of: Callable[[int], np.ndarray], device: torch.device,
                side: torch.cuda.Stream) -> None:
        """One graph per count, each warmed and captured on `index_of(count)` (rows no session
        uses) on `side`: the caching allocator gives a block freed on one stream back only to
        that stream, so the warm-ups and captures of every count share the caller's one."""
        for n in COUNTS:
            host = torch.from_numpy(np.ascontiguousarray(index_of(n), np.int64)).pin_memory()
            index = host.to(device)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.work(index)            # the warm-up (kernel builds) a capture wants first
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=side):
                self.work(index)
            self.graphs[n] = (graph, index, host, torch.cuda.Event())
        self.counts = COUNTS

    def count_for(self, n: int) -> int | None:
        """The smallest captured count that holds n rows (None: none does)."""
        return next((c for c in self.counts if c >= n), None)

    def run(self, index: np.ndarray, device: torch.device) -> None:
        """The work on `index` (its last axis a captured count, padded by the caller): one
        replay where a graph was captured, else eagerly."""
        entry = self.graphs.get(index.shape[-1])
        if entry is None:
            self.work(torch.as_tensor(index, dtype=torch.long, device=device))
            return
        graph, dev, host, copied = entry
        # the last copy from `host` may still be queued (work behind a beat's end runs while
        # the host goes on): it must read the old index before the new one is written
        copied.synchronize()
        host.numpy()[:] = index
        dev.copy_(host, non_blocking=True)
        copied.record()
        graph.replay()
