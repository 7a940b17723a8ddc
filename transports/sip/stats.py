"""The bridge's counters (`BridgeStats`, logged as the `stats` event on close) and its default
event sink (`print_event`: one JSON object a line on stdout)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass
class BridgeStats:
    datagrams: int = 0
    requests: int = 0
    responses: int = 0
    keepalives: int = 0
    garbage: int = 0                 # unparseable and unanswerable: dropped
    bad_requests: int = 0            # answered 400
    retransmits_in: int = 0          # retransmitted requests answered again
    retransmits_out: int = 0         # our responses/requests resent on the T1 schedule
    stray: int = 0                   # ACKs and responses matching nothing
    calls_offered: int = 0
    calls_answered: int = 0
    calls_refused: int = 0           # new calls answered with an error (CANCEL's 487 aside)
    calls_cancelled: int = 0
    calls_ended: int = 0
    ack_timeouts: int = 0
    internal_errors: int = 0
    dtmf_keys: int = 0               # RFC 4733 key presses, each once
    finals: dict = field(default_factory=dict)    # final status sent -> count
    refusals: dict = field(default_factory=dict)  # refused calls by reason -> count

    def as_dict(self) -> dict:
        return asdict(self)


def print_event(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}, default=str), flush=True)
