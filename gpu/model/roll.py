"""Rolling a session's attention caches at the end of its context: the rows after its sinks move
down by the frames dropped (ThinkerState.roll, TalkerState.roll). Moved in blocks of positions,
lowest first, each no longer than the drop: a block's source rows lie wholly above the rows it
writes, so it copies without a temporary; the block before it has read the rows it overwrites
(the copies are ordered on one stream); temporaries (the talker's rotated keys) stay a block's
size instead of a whole cache's."""
from __future__ import annotations

ROLL_BLOCK_BYTES = 64 << 20     # the most temporary memory one block of a roll takes


def roll_blocks(first: int, stop: int, bytes_per_position: int, drop: int) -> list[tuple[int, int]]:
    """[first, stop) cut into blocks of at most `drop` positions and ROLL_BLOCK_BYTES, in order."""
    step = max(1, min(drop, ROLL_BLOCK_BYTES // max(1, bytes_per_position)))
    return [(a, min(a + step, stop)) for a in range(first, stop, step)]
