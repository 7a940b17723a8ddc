"""How the bridge says no: a new call refused (its INVITE transaction's final response, logged
once as `call_refused` and counted by reason), any other request rejected, and the node's
refusal of our `open` mapped to a SIP status. Retry-After goes only where trying again later
can work (RFC 3261 §21.5.4: a 503 without it is taken as a 500).
"""
from __future__ import annotations

from typing import Callable

from transports import client as C
from transports import protocol as P
from transports.sip import message as M
from transports.sip.config import BridgeConfig
from transports.sip.dialog import hostport, new_tag
from transports.sip.transaction import InviteTx, Transactions

RETRYABLE_NODE_REFUSALS = ("capacity", "admission", "draining", "duplicate")   # may succeed later
LOGGED_HEADER_CHARS = 256          # a From header is logged at most this long


def new_invite(msg: M.SipMessage) -> bool:
    """An INVITE that starts a call (no To tag), as far as a partly parsed one tells."""
    if not msg.is_request or msg.method != "INVITE":
        return False
    try:
        return M.parse_name_addr(msg.get("To") or "").tag is None
    except ValueError:
        return True


def warning(code: int, text: str) -> tuple[str, str]:
    text = text.replace("\\", "\\\\").replace('"', '\\"')[:200]
    return ("Warning", f'{code} wave "{text}"')


class Refusals:
    def __init__(self, cfg: BridgeConfig, tx: Transactions, stats, emit: Callable[..., None]):
        self.cfg, self.tx, self.stats, self.emit = cfg, tx, stats, emit

    def node_refusal(self, exc: C.Refused) -> tuple:
        """The node refused our `open`: capacity as configured; others 503, with Retry-After
        only where a later try can succeed."""
        status = self.cfg.capacity_status if exc.reason in ("capacity", "admission") else 503
        retry = self.retry_after() if exc.reason in RETRYABLE_NODE_REFUSALS else []
        reason = f"node_{exc.reason}" if exc.reason in P.REFUSE_REASONS else "node_refused"
        return status, reason, [*retry, warning(399, f"node refused: {exc}")], str(exc)

    def retry_after(self) -> list[tuple[str, str]]:
        return [("Retry-After", str(self.cfg.retry_after))] if self.cfg.retry_after else []

    def reject(self, req: M.SipMessage, addr, status: int, reason: str, headers,
                detail: str = "") -> None:
        """An error for an INVITE (a new call: refused; in a dialog: its re-offer refused) or
        any other request."""
        if new_invite(req):
            self.refuse(req, addr, status, reason, headers=headers, detail=detail)
            return
        if status == 400:
            self.stats.bad_requests += 1
        self.tx.respond(req, addr, status, cache=status != 400, headers=headers)

    def refuse(self, req: M.SipMessage, addr, status: int, reason: str, *, headers=(),
                detail: str = "", tx: InviteTx | None = None, stateless: bool = False) -> None:
        """Answer a new call's INVITE with an error as its server transaction's final response
        (statelessly when the transaction table is full); log and count it once."""
        if tx is None and not stateless:
            tx = InviteTx(req, addr, new_tag())
            if not self.tx.add_invite(tx):
                tx = None
        if tx is None:
            self.tx.respond(req, addr, status, to_tag=new_tag(), headers=headers)
        elif tx.final is None:
            self.tx.final(tx, status, headers=headers)
        else:
            return                                   # answered already (CANCEL, shutdown)
        if status == 400:
            self.stats.bad_requests += 1
        self.log(req, addr, status, reason, detail)

    def log(self, req: M.SipMessage, addr, status: int, reason: str,
                     detail="") -> None:
        self.stats.calls_refused += 1
        self.stats.refusals[reason] = self.stats.refusals.get(reason, 0) + 1
        self.emit("call_refused", call_id=req.get("Call-ID"), status=status, reason=reason,
                  source=hostport(*addr[:2]), detail=str(detail)[:LOGGED_HEADER_CHARS],
                  **{"from": (req.get("From") or "")[:LOGGED_HEADER_CHARS]})
