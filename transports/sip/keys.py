"""A caller's key presses, by either road a phone sends them: RFC 4733 events in its RTP
(`media/dtmf.py` makes one `Key` of each press) or a SIP INFO request in the dialog, with the
de facto bodies PBXs send (`application/dtmf-relay`: a `Signal=5` line; `application/dtmf`:
the key alone). Each press goes to its call's node session as an `event` once, is logged and
counted; INFO presses share the call's rate bound with RTP ones (past it: counted as
suppressed, not sent). An empty INFO (a keep-alive some peers send) gets 200; one for an Info
Package (RFC 6086) 469, since we take none; another body type 415; a dtmf body without a key
400.
"""
from __future__ import annotations

from typing import Callable

from transports.sip import message as M
from transports.sip.call import Call
from transports.sip.media import dtmf
from transports.sip.media.pacer import Clock
from transports.sip.refusals import warning
from transports.sip.stats import BridgeStats
from transports.sip.transaction import Transactions


class Keys:
    def __init__(self, tx: Transactions, stats: BridgeStats, emit: Callable[..., None],
                 clock: Clock):
        self.tx, self.stats, self.emit, self.clock = tx, stats, emit, clock

    def from_rtp(self, call: Call, key: dtmf.Key) -> None:
        self.stats.dtmf_keys += 1
        sent = call.send_key(key.digit)
        self.emit("dtmf", call_id=call.sip_call_id, session=call.session_id, digit=key.digit,
                  code=key.event, rtp_timestamp=key.timestamp, ssrc=key.ssrc,
                  dbm0=-key.volume, sent_to_node=sent)

    def from_info(self, req: M.SipMessage, addr, call: Call) -> None:
        """An in-dialog INFO (its dialog and CSeq already accepted): answered, and its key
        sent on."""
        ctype = (req.get("Content-Type") or "").split(";")[0].strip().lower()
        if not req.body and not req.get("Info-Package"):
            self.tx.respond(req, addr, 200)         # an empty INFO: some peers' keep-alive
            return
        if req.get("Info-Package"):
            self.tx.respond(req, addr, 469, headers=[("Recv-Info", "")])
            return
        if ctype not in dtmf.INFO_TYPES:
            self.tx.respond(req, addr, 415, headers=[("Accept", ", ".join(dtmf.INFO_TYPES))])
            return
        try:
            digit = dtmf.info_digit(ctype, req.body)
        except dtmf.DtmfError as exc:
            self.tx.respond(req, addr, 400, headers=[warning(399, str(exc))])
            return
        self.tx.respond(req, addr, 200)
        if not call.dtmf.press(self.clock.now()):
            return
        self.stats.dtmf_keys += 1
        self.emit("dtmf", call_id=call.sip_call_id, session=call.session_id, digit=digit,
                  via="info", sent_to_node=call.send_key(digit))
