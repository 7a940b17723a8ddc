"""The bridge's one configuration, frozen at start (nothing writes to it afterwards)."""
from __future__ import annotations

from dataclasses import dataclass, field

from transports.sip.media.jitter import JitterConfig
from transports.sip.media.pacer import PlayoutConfig

CAPACITY_STATUSES = (503, 486)
MAX_RETRY_AFTER = 86400                    # a day; RFC 3261 allows more, no caller needs it


@dataclass(frozen=True)
class BridgeConfig:
    node: str = "tcp://127.0.0.1:5555"     # the node's ROUTER endpoint
    fleet: str | None = None               # a fleet's Ray address: calls placed by its directory
    host: str = "127.0.0.1"                # SIP listen address (UDP and TCP)
    port: int = 5060
    media_ip: str = ""                     # address put in SDP and bound for RTP; "" = host
    rtp_ports: tuple[int, int] = (0, 0)    # RTP port range (even ports); (0, 0) = ephemeral
    max_calls: int = 64                    # calls at once; more get `capacity_status`
    tcp_connections: int = 1024            # SIP over TCP on the same port, connections at
                                           # once (0: UDP only)
    # A call refused for capacity (max_calls here, or the node's slots all taken) is answered
    # 503 Service Unavailable by default: proxies then try another server (RFC 3263) and keep
    # away from this one for Retry-After seconds (RFC 3261 §21.5.4). 486 Busy Here instead says
    # the callee is busy, which a proxy passes back to the caller rather than failing over.
    capacity_status: int = 503             # 503 or 486
    retry_after: int = 5                   # Retry-After, s, on transient refusals; 0: none
    telephone_event: bool = True           # agree RFC 4733 DTMF events when offered
    instructions: str = ""                 # system prompt sent with every node `open`
    t1: float = 0.5                        # RFC 3261 timers, s
    t2: float = 4.0
    t4: float = 5.0
    open_timeout: float = 5.0              # node `open` answer, s; then 503
    rtp_timeout: float = 5.0               # no RTP from a sending caller for this long: BYE
    node_timeout: float = 5.0              # no event from the node for this long: BYE
    fill_after: float = 0.2                # caller quiet this long: feed the node silence, s
    uplink_queue: int = 100                # packets (2 s) queued towards the node at most
    # Kernel buffers, bytes (0: the kernel's default). The SIP socket holds a burst of INVITEs
    # that lands while the loop is busy: 300 of them take ~700 KB of kernel accounting, three
    # times Linux's usual default. An RTP socket gets 50 packets/s: 128 KiB holds seconds of
    # them, and bounds what a flood can queue behind a stalled loop.
    sip_rcvbuf: int = 4 << 20
    sip_sndbuf: int = 4 << 20
    rtp_rcvbuf: int = 128 << 10
    rtp_sndbuf: int = 64 << 10
    jitter: JitterConfig = field(default_factory=JitterConfig)
    playout: PlayoutConfig = field(default_factory=PlayoutConfig)
    user_agent: str = "wave-sip/1"

    def __post_init__(self):
        if self.capacity_status not in CAPACITY_STATUSES:
            raise ValueError(f"capacity_status must be one of {CAPACITY_STATUSES}")
        if isinstance(self.retry_after, bool) or not isinstance(self.retry_after, int) \
                or not 0 <= self.retry_after <= MAX_RETRY_AFTER:
            raise ValueError(f"retry_after must be whole seconds, 0..{MAX_RETRY_AFTER}")

    @property
    def rtp_ip(self) -> str:
        """Where RTP is bound and what SDP and Contact/Via advertise."""
        return self.media_ip or self.host

    @property
    def timer_b(self) -> float:
        """64*T1: how long a transaction waits for an ACK or a final response."""
        return 64 * self.t1
