"""SIP transactions (RFC 3261 §17), as much as a bridge that answers calls needs. Over TCP
(`tcp.reliable`) nothing is resent but a 2xx to an INVITE (§17.1.2.2, §17.2.1, §13.3.1.4).

- Non-INVITE server transactions: the final response is cached for 64*T1 under the request's
  branch (or Call-ID/CSeq for pre-3261 peers) and resent when the request is retransmitted.
- INVITE server transactions (`InviteTx`): the last response is resent on a retransmitted
  INVITE; a final response (2xx included: the TU's duty of §13.3.1.4, folded in here) is resent
  at T1, 2T1 ... capped at T2 until the ACK, for at most 64*T1; a 2xx never ACKed is reported to
  the caller of `final` (the bridge then hangs up with BYE).
- Non-INVITE client transactions (our BYE): resent on timer E until a final response, 64*T1.

Every table is bounded (`MAX_TRANSACTIONS`) and expires in the bridge's housekeeping.
"""
from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from transports.sip import message as M
from transports.sip.config import BridgeConfig
from transports.sip.dialog import new_tag
from transports.sip.media.pacer import Clock
from transports.sip.tcp import reliable
from wave_actors.core.tasks import within

MAX_TRANSACTIONS = 4096


@dataclass
class InviteTx:
    request: M.SipMessage
    addr: tuple[str, int]
    local_tag: str
    call: object | None = None          # the Call being set up (server.Call)
    dialog: object | None = None        # the Dialog the 2xx created (dialog.Dialog)
    last: bytes | None = None           # the last response sent (resent on a retransmission)
    final: int | None = None            # status of the final response, once sent
    offered: bool = False               # our 2xx carried an offer: the ACK carries the answer
    acked: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None    # answering: binding RTP, opening the node session
    expires: float = float("inf")       # when the entry may be forgotten

    @property
    def key(self) -> tuple[str, int]:
        return tx_key(self.request)


def tx_key(msg: M.SipMessage) -> tuple[str, int]:
    """An INVITE, its ACK and its CANCEL share Call-ID and CSeq number."""
    return (msg.get("Call-ID") or "", M.parse_cseq(msg.get("CSeq"))[0])


def cache_key(req: M.SipMessage) -> tuple:
    via = M.split_commas(req.get("Via") or "")
    branch = M.parse_via(via[0]).params.get("branch") if via else None
    if branch and branch.startswith("z9hG4bK"):
        return (branch, req.method)
    return (req.get("Call-ID"), req.get("CSeq"), req.method)


class Transactions:
    def __init__(self, cfg: BridgeConfig, clock: Clock, send: Callable[[bytes, tuple], bool],
                 spawn: Callable[[Awaitable], asyncio.Task], stats):
        self.cfg, self.clock, self._send, self._spawn, self.stats = cfg, clock, send, spawn, stats
        self.invites: collections.OrderedDict[tuple, InviteTx] = collections.OrderedDict()
        self._cache: collections.OrderedDict[tuple, tuple[bytes, float]] = \
            collections.OrderedDict()
        self._client: dict[str, asyncio.Future] = {}     # branch of our request -> final status

    # ------------------------------------------------------------------------- server side

    def respond(self, req: M.SipMessage, addr, status: int, reason: str | None = None, *,
                to_tag: str | None = None, headers=(), body: bytes = b"",
                cache: bool = True) -> bytes:
        """Send a response to `addr` (where the request came from: RFC 3581 symmetric). A final
        or provisional answer to a request whose To has no tag gets one (RFC 3261 §8.2.6.2),
        stateless ones included; a retransmission is answered from the cache, same tag."""
        if to_tag is None and status > 100:
            to_tag = new_tag()
        hdrs = [("Server", self.cfg.user_agent), *headers]
        if body:
            hdrs.append(("Content-Type", "application/sdp"))
        data = M.make_response(req, status, reason, to_tag=to_tag, source=addr, headers=hdrs,
                               body=body).to_bytes()
        self._send(data, addr)
        if status >= 200:
            self.stats.finals[status] = self.stats.finals.get(status, 0) + 1
            if cache and req.method != "INVITE":
                self._cache[cache_key(req)] = (data, self.clock.now() + self.cfg.timer_b)
                while len(self._cache) > MAX_TRANSACTIONS:
                    self._cache.popitem(last=False)
        return data

    def cached(self, req: M.SipMessage) -> bytes | None:
        hit = self._cache.get(cache_key(req))
        return None if hit is None else hit[0]

    def add_invite(self, tx: InviteTx) -> bool:
        """Track a new INVITE transaction; False when the table is full of live ones."""
        while len(self.invites) >= MAX_TRANSACTIONS:
            done = next((k for k, t in self.invites.items() if t.final is not None), None)
            if done is None:
                return False
            del self.invites[done]
        self.invites[tx.key] = tx
        return True

    def provisional(self, tx: InviteTx, status: int, headers=()) -> None:
        if tx.final is None:
            tx.last = self.respond(tx.request, tx.addr, status, to_tag=tx.local_tag,
                                   headers=headers)

    def final(self, tx: InviteTx, status: int, *, body: bytes = b"", headers=(),
              on_no_ack: Callable[[InviteTx], Awaitable] | None = None) -> None:
        """Send the INVITE's final response; resend it until the ACK (at most 64*T1)."""
        if tx.final is not None:
            return
        tx.final = status
        tx.last = self.respond(tx.request, tx.addr, status, to_tag=tx.local_tag,
                               headers=headers, body=body)
        tx.expires = self.clock.now() + self.cfg.timer_b + self.cfg.t4
        self._spawn(self._resend_until_ack(tx, on_no_ack))

    async def _resend_until_ack(self, tx: InviteTx, on_no_ack) -> None:
        interval, deadline = self.cfg.t1, self.clock.now() + self.cfg.timer_b
        while self.clock.now() < deadline:
            try:
                await within(tx.acked.wait(), min(interval, deadline - self.clock.now()))
                return
            except asyncio.TimeoutError:
                pass
            if self.clock.now() < deadline and (tx.final < 300 or not reliable(tx.addr)):
                self._send(tx.last, tx.addr)
                self.stats.retransmits_out += 1
            interval = min(2 * interval, self.cfg.t2)
        if not tx.acked.is_set() and on_no_ack is not None:
            await on_no_ack(tx)

    # ------------------------------------------------------------------------- client side

    async def request(self, req: M.SipMessage, dest: tuple[str, int]) -> int | None:
        """Send a non-INVITE request; its final status, or None after 64*T1 without one."""
        branch = M.parse_via(req.get("Via")).params["branch"]
        fut = self._client[branch] = asyncio.get_running_loop().create_future()
        data = req.to_bytes()
        interval, deadline = self.cfg.t1, self.clock.now() + self.cfg.timer_b
        try:
            if not self._send(data, dest):
                return None                 # its TCP connection is gone
            if reliable(dest):
                try:
                    return await within(asyncio.shield(fut), self.cfg.timer_b)
                except asyncio.TimeoutError:
                    return None
            while self.clock.now() < deadline:
                try:
                    return await within(asyncio.shield(fut), interval)
                except asyncio.TimeoutError:
                    self._send(data, dest)
                    self.stats.retransmits_out += 1
                    interval = min(2 * interval, self.cfg.t2)
            return None
        finally:
            self._client.pop(branch, None)

    def on_response(self, resp: M.SipMessage) -> bool:
        """Match a response to one of our requests by its top Via branch."""
        try:
            branch = M.parse_via(M.split_commas(resp.get("Via") or "")[0]).params.get("branch")
        except (ValueError, IndexError):
            return False
        fut = self._client.get(branch or "")
        if fut is None:
            return False
        if resp.status >= 200 and not fut.done():
            fut.set_result(resp.status)
        return True

    def expire(self, now: float) -> None:
        for key in [k for k, (_, exp) in self._cache.items() if exp < now]:
            del self._cache[key]
        for key in [k for k, tx in self.invites.items() if tx.expires < now]:
            del self.invites[key]
