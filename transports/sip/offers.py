"""The bridge's side of SDP offer/answer (RFC 3264): what an INVITE's body offers, whether we
can take it, and the SDP we answer (or offer, to an INVITE that came without one).

Only the bridge's configuration is read here (its RTP address and whether it offers
telephone-event); the transaction and the refusal it gets stay with the bridge.
"""
from __future__ import annotations

from typing import NamedTuple

from transports.sip import message as M
from transports.sip import sdp
from transports.sip.config import BridgeConfig
from transports.sip.refusals import warning


class Refusal(NamedTuple):
    """Why an offer is refused: the final status, the counted reason, headers and detail."""
    status: int
    reason: str
    headers: list
    detail: str


def negotiate(cfg: BridgeConfig, offer: sdp.Session, port: int, session_id: int = 0,
              version: int = 0) -> sdp.Answer:
    return sdp.negotiate(offer, cfg.rtp_ip, port, session_id, version,
                         events=cfg.telephone_event)


def check(cfg: BridgeConfig, req: M.SipMessage) -> sdp.Session | None | Refusal:
    """The request's SDP offer; None when it has no body (we offer); else why it is refused."""
    if not req.body:
        return None
    ctype = (req.get("Content-Type") or "").split(";")[0].strip().lower()
    if ctype != "application/sdp":
        return Refusal(415, "unsupported_media_type", [("Accept", "application/sdp")], ctype)
    try:
        offer = sdp.parse(req.body)
        negotiate(cfg, offer, 0)
    except sdp.NotAcceptable as exc:
        return Refusal(488, "no_common_codec", [warning(305, str(exc))], str(exc))
    except sdp.SdpError as exc:
        return Refusal(400, "bad_sdp", [warning(399, f"bad SDP: {exc}")], str(exc))
    return offer


def answer_sdp(cfg: BridgeConfig, codec: sdp.Codec, port: int, offer: sdp.Session | None,
               session_id: int, version: int) -> tuple[sdp.Answer | None, bytes]:
    """Our answer to `offer` for RTP on `port`; without an offer, our offer of `codec` (the
    caller answers in the ACK)."""
    if offer is None:
        return None, sdp.offer(cfg.rtp_ip, port, session_id, version, codecs=(codec,),
                               events=cfg.telephone_event).to_bytes()
    answer = negotiate(cfg, offer, port, session_id, version)
    return answer, answer.sdp.to_bytes()
