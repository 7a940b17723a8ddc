"""What a session actor is told (its mailbox's messages), how it is configured, and what it
counts. Apart from the actor (`session.py`) so that the node, the hosts and the session
workers name these without the actor's audio and text machinery."""
from __future__ import annotations

from dataclasses import dataclass

from wave_actors.core.contract import Handle
from wave_actors.core.frames import IN_RATE, SAMPLES_IN


@dataclass
class AudioIn:
    seq: int
    payload: bytes


@dataclass
class GapDue:
    """A missing input seq's wait has run out (ReorderBuffer.deadline)."""


@dataclass
class FunctionResult:
    call_id: str
    output: str


@dataclass
class Close:
    reason: str = "client"          # client | lost | drain | crash

@dataclass
class SessionCounters:
    messages_in: int = 0
    samples_in: int = 0             # at the client's rate, in messages taken (not duplicates)
    reordered: int = 0
    duplicates: int = 0             # messages
    seq_gaps: int = 0               # seqs never received (skipped)
    after_gap: int = 0              # messages that came after their seq was skipped (dropped)
    bad_payloads: int = 0           # messages
    dropped_in_mailbox: int = 0     # audio messages the mailbox dropped under overload
    flooded: int = 0                # audio messages the node's flood limit dropped
    dropped_samples: int = 0        # every input drop above, in samples at the client's rate
    dropped_out: int = 0            # output frames the client could not take
    frames_sent: int = 0
    engine_unavailable: int = 0     # frames the clock could not take (it was restarting)
    held_high: int = 0              # most frames held back at once (input ahead of real time)
    held_overflow: int = 0          # frames refused past the hold's bound (also in dropped)
    tool_refused: int = 0           # function results refused: too many tool tokens waiting


@dataclass
class SessionConfig:
    session: str
    handle: Handle                  # the session in the clock's table
    sample_rate: int
    format: str
    output_sample_rate: int
    output_format: str
    clock_endpoint: str
    # Input ahead of real time (a file, a burst of frames) waits here, up to `hold_frames`
    # (60 s), and goes to the clock as real time reaches it, at most `lead_frames` early: the
    # clock's jitter buffer sheds a standing excess (a stall's backlog, to bring latency back),
    # so what was sent early would be shed there. Input behind real time (a stall's burst)
    # goes through at once, for the jitter buffer to handle as before.
    hold_frames: int = 750
    lead_frames: int = 2

    @property
    def frame_samples(self) -> float:
        """Samples of one 80 ms frame at the client's rate."""
        return self.sample_rate * SAMPLES_IN / IN_RATE
