"""Rolling a session's attention caches at the end of its context: the rows after its sinks move
down by the frames dropped (ThinkerState.roll, TalkerState.roll). Moved in blocks of positions,
lowest first: a block's rows are read whole before it writes (below them), no later block reads
what an earlier one wrote, and temporaries stay a block's size instead of a whole cache's."""
from __future__ import annotations

ROLL_BLOCK_BYTES = 64 << 20     # the most temporary memory one block of a roll takes


def roll_blocks(first: int, stop: int, bytes_per_position: int) -> list[tuple[int, int]]:
    """[first, stop) cut into blocks of at most ROLL_BLOCK_BYTES of positions, in order."""
    step = max(1, ROLL_BLOCK_BYTES // max(1, bytes_per_position))
    return [(a, min(a + step, stop)) for a in range(first, stop, step)]
