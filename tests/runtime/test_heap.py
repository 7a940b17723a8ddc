"""Freed heap pages go back to the system (`wave_actors/core/heap.py`).

Bug caught: a bridge whose resident memory keeps the largest burst it ever served (glibc keeps
freed pages in its heap), which a soak reads as a leak."""
import asyncio
import platform

import pytest

from wave_actors.core import heap

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@glibc
def test_trim_gives_back_a_fragmented_heap():
    # 4 KiB blocks come from glibc's heap (past Python's small-object allocator); keeping one in
    # 64 pins the heap's top, so free() alone cannot give the freed pages back
    blocks = [bytearray(4096) for _ in range(40_000)]
    kept = blocks[::64]
    del blocks
    before = _rss_kb()
    assert heap.trim()
    after = _rss_kb()
    assert before - after > 60_000, (before, after)     # of ~157 MB freed, most given back
    assert len(kept) == 625


@glibc
def test_trimmer_trims_once_after_a_burst_of_ends():
    async def body():
        t = heap.Trimmer(delay_s=0.05)
        for _ in range(10):
            t.soon()
        await asyncio.sleep(0.2)
        assert t.trims == 1
        t.soon()
        t.cancel()
        await asyncio.sleep(0.1)
        assert t.trims == 1
    asyncio.run(body())
