"""The Realtime bridge's settings (`python -m transports.realtime` sets them from its flags)."""
from __future__ import annotations

from dataclasses import dataclass

from transports import client as C
from transports.realtime.feed import FeedPolicy


@dataclass(frozen=True)
class BridgeConfig:
    node: str = "tcp://127.0.0.1:5555"
    fleet: str | None = None              # a fleet's Ray address: calls placed by its directory
    host: str = "127.0.0.1"
    port: int = 8125                      # 0: any free port (tests)
    path: str = "/v1/realtime"
    api_key: str | None = None            # None: no authentication (only if asked for explicitly)
    curve: C.CurveKeys | None = None      # CURVE keys towards the node
    max_event_bytes: int = 1 << 20        # larger events get an `error`; the connection stays
    max_frame_bytes: int = 4 << 20        # larger WebSocket messages close it (1009), unread
    outbox_bytes: int = 512 << 10         # ~6 s of 24 kHz audio deltas; audio dropped past it
    outbox_hard_bytes: int = 2 << 20      # other events past it: the connection is aborted
    stall_grace_s: float = 10.0           # a reader stalled this long is disconnected
    sndbuf_bytes: int = 128 << 10         # kernel send buffer per connection (~1.5 s of audio)
    turn_gap_frames: int = 10             # agent/user transcript quiet that ends a turn (800 ms)
    open_timeout_s: float = 10.0
    node_send_timeout_s: float = 5.0      # the node's DEALER queue full this long: node is gone
    feed: FeedPolicy = FeedPolicy()       # input queued and fed at the model's pace (feed.py)
    resume_grace_s: float = 30.0          # vllm-omni: a dropped socket's session waits this long
