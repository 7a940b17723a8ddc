"""How an executor cuts a session's start into start rows, and the GPU executor's sizes: rows
a beat carries, prompt positions a row takes, the talker's warm-up, the positions reserved for
the prompt, and the closed slots a beat cleans. The slot book plans by it; the simulator uses
the GPU's, so its starts are the engine's.
"""
from __future__ import annotations

from dataclasses import dataclass


# The GPU executor's start rows: every captured beat can carry 16 starting sessions' next 16
# prompt positions (a bench prompt fits in one chunk; a long one takes a beat per chunk). The
# simulator uses the same shape, so its starts are the engine's.
START_ROWS = 16
# A second, smaller capture of the start rows: a beat pays for every row its graph holds, used
# or padded, and under steady churn most beats that start anything start one or two sessions.
SMALL_START_ROWS = 4
PREFILL_CHUNK = 16
TALKER_WARMUP = 37          # warm-up positions of the full talker (docs/MODEL.md §2.5)
GRAPH_MAX_PROMPT = 512      # thinker positions the GPU reserves for the system prompt
# Slots whose sessions closed, reset behind a beat's work (one captured graph on the GPU holds
# 16): the next session in such a slot starts without a reset in its own beat. More closes in
# one beat wait for later beats, or reset at their next open.
CLEANS_PER_BEAT = 16


@dataclass(frozen=True, kw_only=True)
class StartShape:
    """How an executor cuts a session's start into start rows."""
    prefill_chunk: int = PREFILL_CHUNK          # prompt positions per row
    start_rows: int = START_ROWS                # starting slots one beat advances
    small_rows: int = SMALL_START_ROWS          # the smaller capture (0 or ≥ start_rows: none)
    warmup_positions: int = TALKER_WARMUP       # the talker's warm-up positions (copied at reset)
    max_prompt: int = GRAPH_MAX_PROMPT          # thinker positions reserved for the prompt
    cleans: int = CLEANS_PER_BEAT               # closed slots a beat resets behind its work

    def __post_init__(self) -> None:
        if min(self.prefill_chunk, self.start_rows, self.max_prompt) < 1 \
                or min(self.small_rows, self.cleans) < 0:
            raise ValueError(f"every size of a StartShape is positive: {self}")

    @property
    def row_captures(self) -> tuple[int, ...]:
        """The start-row counts a captured beat holds: 0 (none), the small one, the full one."""
        return tuple(sorted({0, self.start_rows} | ({self.small_rows}
                                                     if 0 < self.small_rows < self.start_rows
                                                     else set())))

    def capture_for(self, rows: int) -> int:
        """The smallest row capture that holds `rows` start rows."""
        return min(c for c in self.row_captures if c >= rows)
