"""The SIP side of the bridge: a UDP user agent server that turns each call into a node session.

Every datagram is parsed and answered synchronously where it can be (OPTIONS, BYE, CANCEL, errors);
an INVITE starts a task that binds an RTP port, opens the node session and answers 200 OK with
SDP (or 486/503 when the node refuses). Order of checks on a request (RFC 3261 §8.2): parse ->
version (505) -> mandatory headers (400) -> method (405/501) -> Require (420) -> body (415, 400
for broken SDP, 488 when no codec matches). Garbage that cannot be addressed is counted, never
answered; no datagram can raise out of `on_datagram`. Non-INVITE responses are cached for 64*T1
and resent on retransmitted requests; the INVITE transaction is in `dialog.InviteTx`.
"""
from __future__ import annotations

import asyncio
import collections
import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Callable

from transports import client as C
from transports.sip import message as M
from transports.sip import sdp
from transports.sip.call import Call
from transports.sip.config import BridgeConfig
from transports.sip.dialog import Dialog, InviteTx, new_tag, tx_key
from transports.sip.pacer import Clock, MonotonicClock

ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS"
KNOWN_METHODS = ("REGISTER", "INFO", "UPDATE", "PRACK", "SUBSCRIBE", "NOTIFY", "REFER",
                 "MESSAGE", "PUBLISH")
MAX_TRANSACTIONS = 4096              # cached transactions at most (oldest completed go first)


@dataclass
class BridgeStats:
    datagrams: int = 0
    requests: int = 0
    responses: int = 0
    keepalives: int = 0
    garbage: int = 0                 # unparseable and unanswerable: dropped
    bad_requests: int = 0            # answered 400
    retransmits_in: int = 0          # retransmitted requests answered from cache
    retransmits_out: int = 0         # our responses/requests sent again on the T1 schedule
    stray: int = 0                   # ACKs and responses matching nothing
    calls_offered: int = 0
    calls_answered: int = 0
    calls_refused: int = 0           # the node said no (486/503)
    calls_cancelled: int = 0
    calls_ended: int = 0
    ack_timeouts: int = 0
    internal_errors: int = 0
    finals: dict = field(default_factory=dict)    # final status sent -> count

    def as_dict(self) -> dict:
        return asdict(self)


def print_event(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}, default=str), flush=True)


class _SipProtocol(asyncio.DatagramProtocol):
    def __init__(self, bridge: "Bridge"):
        self.bridge = bridge

    def datagram_received(self, data: bytes, addr) -> None:
        self.bridge.on_datagram(data, addr)

    def error_received(self, exc: Exception) -> None:
        pass


class Bridge:
    def __init__(self, cfg: BridgeConfig, client: C.NodeClient | None = None,
                 emit: Callable[..., None] = print_event, clock: Clock | None = None):
        self.cfg, self.emit = cfg, emit
        self.clock = clock or MonotonicClock()
        self.client = client or C.NodeClient(cfg.node)
        self.stats = BridgeStats()
        self.transport: asyncio.DatagramTransport | None = None
        self.dialogs: dict[tuple[str, str, str], Dialog] = {}
        self.calls: set[Call] = set()             # every call from INVITE to teardown
        self._itx: collections.OrderedDict[tuple, InviteTx] = collections.OrderedDict()
        self._cache: collections.OrderedDict[tuple, tuple[bytes, float]] = \
            collections.OrderedDict()             # non-INVITE responses: key -> (bytes, expiry)
        self._uac: dict[str, asyncio.Future] = {}  # branch of our request -> final status
        self._tasks: set[asyncio.Task] = set()
        self._housekeeper: asyncio.Task | None = None

    # ------------------------------------------------------------------------- life cycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.client._reader is None:
            self.client.connect()
        self.transport, _ = await loop.create_datagram_endpoint(
            lambda: _SipProtocol(self), local_addr=(self.cfg.host, self.cfg.port))
        self._housekeeper = loop.create_task(self._housekeeping())
        self.emit("listening", sip=self.address, node=self.cfg.node)

    @property
    def address(self) -> tuple[str, int]:
        return self.transport.get_extra_info("sockname")[:2]

    async def close(self, timeout: float = 5.0) -> None:
        """Hang up every call (BYE, node close), then stop listening."""
        for dialog in list(self.dialogs.values()):
            self._spawn(self._hangup(dialog, "shutdown"))
        for tx in list(self._itx.values()):
            if tx.final is None and tx.task is not None:
                tx.task.cancel()
                self._final(tx, 503, headers=[("Retry-After", "5")])
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        if self._housekeeper:
            self._housekeeper.cancel()
        self.emit("stats", **self.stats.as_dict())
        if self.transport:
            self.transport.close()
        await self.client.aclose()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.stats.internal_errors += 1
            self.emit("internal_error", error=repr(task.exception()))

    async def _housekeeping(self) -> None:
        while True:
            await self.clock.sleep(1.0)
            now = self.clock.now()
            for key in [k for k, (_, exp) in self._cache.items() if exp < now]:
                del self._cache[key]
            for key in [k for k, tx in self._itx.items() if tx.expires < now]:
                del self._itx[key]
            del self.client.orphan_errors[:-100]          # the client keeps them unbounded

    # ------------------------------------------------------------------------- datagrams

    def on_datagram(self, data: bytes, addr: tuple) -> None:
        self.stats.datagrams += 1
        try:
            self._on_datagram(data, addr[:2])
        except Exception as exc:                      # a bug must not take the bridge down
            self.stats.internal_errors += 1
            self.emit("internal_error", error=repr(exc))

    def _on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        if not data.strip(b"\r\n\t "):
            self.stats.keepalives += 1
            return
        try:
            msg = M.parse(data)
        except M.SipParseError as exc:
            self._bad_request(exc.partial, exc.reason, addr)
            return
        if not msg.is_request:
            self.stats.responses += 1
            self._on_response(msg)
            return
        self.stats.requests += 1
        if msg.version != M.SIP_VERSION:
            if msg.get("Via") and msg.method != "ACK":
                self._respond(msg, addr, 505)
            else:
                self.stats.garbage += 1
            return
        reason = M.check_request(msg)
        if reason is not None:
            self._bad_request(msg, reason, addr)
            return
        self._on_request(msg, addr)

    def _bad_request(self, partial: M.SipMessage | None, reason: str, addr) -> None:
        """400 where a response can be addressed (a request with a Via), else count it."""
        if partial is None or not partial.is_request or partial.method == "ACK" \
                or not partial.get("Via"):
            self.stats.garbage += 1
            return
        self.stats.bad_requests += 1
        self._respond(partial, addr, 400, cache=False,
                      headers=[("Warning", f'399 wave "{_quote(reason)}"')])

    def _send(self, data: bytes, addr: tuple[str, int]) -> None:
        self.transport.sendto(data, addr)

    def _respond(self, req: M.SipMessage, addr, status: int, reason: str | None = None, *,
                 to_tag: str | None = None, headers: list = (), body: bytes = b"",
                 cache: bool = True) -> bytes:
        hdrs = [("Server", self.cfg.user_agent), *headers]
        if body:
            hdrs.append(("Content-Type", "application/sdp"))
        data = M.make_response(req, status, reason, to_tag=to_tag, source=addr, headers=hdrs,
                               body=body).to_bytes()
        self._send(data, addr)
        if status >= 200:
            self.stats.finals[status] = self.stats.finals.get(status, 0) + 1
        if cache and req.method != "INVITE" and status >= 200:
            self._cache[_cache_key(req)] = (data, self.clock.now() + self.cfg.timer_b)
            while len(self._cache) > MAX_TRANSACTIONS:
                self._cache.popitem(last=False)
        return data

    # ------------------------------------------------------------------------- requests

    def _on_request(self, req: M.SipMessage, addr) -> None:
        method = req.method
        if method == "ACK":
            self._on_ack(req)
            return
        if method != "INVITE" and (hit := self._cache.get(_cache_key(req))) is not None:
            self.stats.retransmits_in += 1
            self._send(hit[0], addr)
            return
        handler = {"INVITE": self._on_invite, "BYE": self._on_bye, "CANCEL": self._on_cancel,
                   "OPTIONS": self._on_options}.get(method)
        if handler is None:
            status = 405 if method in KNOWN_METHODS else 501
            self._respond(req, addr, status, headers=[("Allow", ALLOW)])
            return
        if method != "CANCEL" and (require := req.get("Require")):
            self._respond(req, addr, 420, headers=[("Unsupported", require)])
            return
        handler(req, addr)

    def _on_options(self, req: M.SipMessage, addr) -> None:
        self._respond(req, addr, 200, to_tag=new_tag(), headers=[
            ("Allow", ALLOW), ("Accept", "application/sdp"), ("Accept-Language", "en")])

    def _on_invite(self, req: M.SipMessage, addr) -> None:
        tx = self._itx.get(tx_key(req))
        if tx is not None:                                  # a retransmission
            self.stats.retransmits_in += 1
            if tx.last is not None:
                self._send(tx.last, tx.addr)
            return
        if M.parse_name_addr(req.get("To")).tag is not None:
            self._on_reinvite(req, addr)
            return
        offer = self._check_offer(req, addr)
        if offer is False:
            return
        if not req.get("Contact"):
            self._bad_request(req, "missing Contact", addr)
            return
        self.stats.calls_offered += 1
        if len(self.calls) >= self.cfg.max_calls:
            self._respond(req, addr, 503, headers=[("Retry-After", "5")])
            return
        codec = sdp.negotiate(offer, self.cfg.rtp_ip, 0, 0, 0).codec if offer else sdp.PCMU
        call = Call(self.cfg, req.get("Call-ID"), codec, self._on_call_end, self.clock)
        self.calls.add(call)
        tx = InviteTx(req, addr, new_tag(), call=call)
        self._itx[tx.key] = tx
        self._provisional(tx, 100)
        tx.task = self._spawn(self._answer(tx, offer))

    def _check_offer(self, req: M.SipMessage, addr) -> sdp.Session | None | bool:
        """The SDP offer of an INVITE (None: none, we offer), or False once answered with an error."""
        if not req.body:
            return None
        ctype = (req.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype != "application/sdp":
            self._respond(req, addr, 415, headers=[("Accept", "application/sdp")])
            return False
        try:
            offer = sdp.parse(req.body)
            sdp.negotiate(offer, self.cfg.rtp_ip, 0, 0, 0)
        except sdp.NotAcceptable as exc:
            self._respond(req, addr, 488, headers=[("Warning", f'305 wave "{_quote(str(exc))}"')])
            return False
        except sdp.SdpError as exc:
            self._bad_request(req, f"bad SDP: {exc}", addr)
            return False
        return offer

    async def _answer(self, tx: InviteTx, offer: sdp.Session | None) -> None:
        """Bind RTP, open the node session, answer 200 OK with SDP (or the right error)."""
        call = tx.call
        try:
            await call.bind()
            self._provisional(tx, 180)
            await call.open_node(self.client)
        except C.Refused as exc:
            self.stats.calls_refused += 1
            status = 486 if exc.reason == "capacity" else 503
            self._final(tx, status, headers=[("Warning", f'399 wave "node refused: '
                                              f'{_quote(str(exc))}"')])
            return await self._discard(call)
        except (asyncio.TimeoutError, OSError) as exc:
            self._final(tx, 503, headers=[("Retry-After", "5"), (
                "Warning", f'399 wave "{type(exc).__name__}: node or RTP unavailable"')])
            return await self._discard(call)
        except asyncio.CancelledError:                       # CANCEL or shutdown
            await self._discard(call)
            raise
        self._establish(tx, call, offer)

    def _establish(self, tx: InviteTx, call: Call, offer: sdp.Session | None) -> None:
        req, session_id = tx.request, int(call.session_id[4:12], 16)
        if offer is not None:
            answer = sdp.negotiate(offer, self.cfg.rtp_ip, call.local_port, session_id, 1)
            body = answer.sdp.to_bytes()
        else:                                    # late offer: the caller answers in the ACK
            answer = None
            body = sdp.offer(self.cfg.rtp_ip, call.local_port, session_id, 1,
                             codecs=(call.codec,)).to_bytes()
        frm, contact = M.parse_name_addr(req.get("From")), M.parse_name_addr(req.get("Contact"))
        dialog = Dialog(req.get("Call-ID"), tx.local_tag, frm.tag or "",
                        f"{req.get('To')};tag={tx.local_tag}", req.get("From"), contact.uri,
                        req.get_all("Record-Route"), tx.addr,
                        M.parse_cseq(req.get("CSeq"))[0], call)
        tx.dialog = dialog
        self.dialogs[dialog.key] = dialog
        self._final(tx, 200, body=body, headers=self._dialog_headers(req))
        self.stats.calls_answered += 1
        call.start(answer)
        self.emit("call_start", call_id=call.sip_call_id, session=call.session_id,
                  codec=call.codec.name, remote=answer.remote if answer else None,
                  rtp_port=call.local_port)

    def _dialog_headers(self, req: M.SipMessage) -> list[tuple[str, str]]:
        host, port = self.address
        hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return [("Contact", f"<sip:wave@{hostport}>"), ("Allow", ALLOW),
                *(("Record-Route", rr) for rr in req.get_all("Record-Route"))]

    async def _discard(self, call: Call) -> None:
        self.calls.discard(call)
        if call.transport is not None:
            call.transport.close()

    def _provisional(self, tx: InviteTx, status: int) -> None:
        if tx.final is None:
            tx.last = self._respond(tx.request, tx.addr, status, to_tag=tx.local_tag,
                                    headers=self._dialog_headers(tx.request) if status > 100
                                    else [])

    def _final(self, tx: InviteTx, status: int, *, body: bytes = b"",
               headers: list = ()) -> None:
        """Send the INVITE's final response; resend it on the T1 schedule until the ACK."""
        if tx.final is not None:
            return
        tx.final = status
        tx.last = self._respond(tx.request, tx.addr, status, to_tag=tx.local_tag,
                                headers=list(headers), body=body)
        tx.expires = self.clock.now() + self.cfg.timer_b + self.cfg.t4
        self._spawn(self._retransmit_final(tx))

    async def _retransmit_final(self, tx: InviteTx) -> None:
        interval, deadline = self.cfg.t1, self.clock.now() + self.cfg.timer_b
        while not tx.acked.is_set():
            remaining = deadline - self.clock.now()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(tx.acked.wait(), min(interval, remaining))
                return
            except asyncio.TimeoutError:
                pass
            if self.clock.now() < deadline:
                self._send(tx.last, tx.addr)
                self.stats.retransmits_out += 1
            interval = min(2 * interval, self.cfg.t2)
        if not tx.acked.is_set() and tx.final == 200 and tx.dialog is not None:
            self.stats.ack_timeouts += 1
            await self._hangup(tx.dialog, "ack_timeout")

    def _on_ack(self, req: M.SipMessage) -> None:
        tx = self._itx.get(tx_key(req))
        if tx is None or tx.final is None:
            self.stats.stray += 1
            return
        tx.acked.set()
        dialog = tx.dialog
        if tx.final != 200 or dialog is None:
            return
        dialog.confirmed = True
        if dialog.call.answer is None and req.body:             # late offer: the answer
            try:
                answer = sdp.negotiate(sdp.parse(req.body), self.cfg.rtp_ip,
                                       dialog.call.local_port, 0, 1)
            except (sdp.SdpError, sdp.NotAcceptable):
                self._spawn(self._hangup(dialog, "bad_answer"))
                return
            if answer.codec.name != dialog.call.codec.name:
                self._spawn(self._hangup(dialog, "bad_answer"))
                return
            dialog.call.update(answer)

    def _on_reinvite(self, req: M.SipMessage, addr) -> None:
        dialog = self._dialog_of(req)
        if dialog is None or dialog.ending:
            self._respond(req, addr, 481)
            return
        cseq = M.parse_cseq(req.get("CSeq"))[0]
        if cseq <= dialog.remote_cseq:
            self._respond(req, addr, 500, "CSeq Out of Order")
            return
        dialog.remote_cseq = cseq
        offer = self._check_offer(req, addr)
        if offer is False:
            return
        call = dialog.call
        tx = InviteTx(req, addr, dialog.local_tag, call=call, dialog=dialog)
        self._itx[tx.key] = tx
        if offer is None:
            body = sdp.offer(self.cfg.rtp_ip, call.local_port, 1, 2,
                             codecs=(call.codec,)).to_bytes()
            self._final(tx, 200, body=body, headers=self._dialog_headers(req))
            return
        answer = sdp.negotiate(offer, self.cfg.rtp_ip, call.local_port, 1, 2)
        if answer.codec.name != call.codec.name:
            self._final(tx, 488, headers=[("Warning", '305 wave "codec change not supported"')])
            return
        self._final(tx, 200, body=answer.sdp.to_bytes(), headers=self._dialog_headers(req))
        call.update(answer)

    def _on_cancel(self, req: M.SipMessage, addr) -> None:
        tx = self._itx.get(tx_key(req))
        if tx is None or tx.request.get("From") != req.get("From"):
            self._respond(req, addr, 481)
            return
        self._respond(req, addr, 200, to_tag=tx.local_tag)
        if tx.final is None:
            self.stats.calls_cancelled += 1
            if tx.task is not None:
                tx.task.cancel()
            self._final(tx, 487)

    def _on_bye(self, req: M.SipMessage, addr) -> None:
        dialog = self._dialog_of(req)
        if dialog is None:
            self._respond(req, addr, 481)
            return
        cseq = M.parse_cseq(req.get("CSeq"))[0]
        if cseq <= dialog.remote_cseq:
            self._respond(req, addr, 500, "CSeq Out of Order")
            return
        dialog.remote_cseq = cseq
        self._respond(req, addr, 200)
        for tx in self._itx.values():
            if tx.dialog is dialog:
                tx.acked.set()                  # a BYE ends the wait for the ACK too
        if not dialog.ending:
            dialog.ending = True
            self._spawn(self._finish(dialog, "bye"))

    def _dialog_of(self, req: M.SipMessage) -> Dialog | None:
        local = M.parse_name_addr(req.get("To")).tag or ""
        remote = M.parse_name_addr(req.get("From")).tag or ""
        return self.dialogs.get((req.get("Call-ID"), local, remote))

    # ------------------------------------------------------------------------- teardown

    def _on_call_end(self, call: Call, reason: str) -> None:
        """The media side ended the call (RTP timeout, node closed or silent): BYE the caller."""
        dialog = next((d for d in self.dialogs.values() if d.call is call), None)
        if dialog is not None:
            self._spawn(self._hangup(dialog, reason))

    async def _hangup(self, dialog: Dialog, reason: str) -> None:
        if dialog.ending:
            return
        dialog.ending = True
        finish = self._spawn(self._finish(dialog, reason))
        status = await self._request(dialog, "BYE")
        self.emit("bye_sent", call_id=dialog.call_id, reason=reason, status=status)
        await finish

    async def _finish(self, dialog: Dialog, reason: str) -> None:
        summary = await dialog.call.stop(reason)
        self.dialogs.pop(dialog.key, None)
        self.calls.discard(dialog.call)
        self.stats.calls_ended += 1
        self.emit("call_end", **summary)

    async def _request(self, dialog: Dialog, method: str) -> int | None:
        """Send an in-dialog request; retransmit (timer E) until a final response or 64*T1."""
        host, port = self.address
        req = dialog.request(method, self.cfg.media_ip or host, port)
        branch = M.parse_via(req.get("Via")).params["branch"]
        fut = self._uac[branch] = asyncio.get_running_loop().create_future()
        data, dest = req.to_bytes(), dialog.destination()
        interval, deadline = self.cfg.t1, self.clock.now() + self.cfg.timer_b
        try:
            self._send(data, dest)
            while self.clock.now() < deadline:
                try:
                    return await asyncio.wait_for(asyncio.shield(fut), interval)
                except asyncio.TimeoutError:
                    self._send(data, dest)
                    self.stats.retransmits_out += 1
                    interval = min(2 * interval, self.cfg.t2)
            return None
        finally:
            self._uac.pop(branch, None)

    def _on_response(self, resp: M.SipMessage) -> None:
        try:
            branch = M.parse_via(M.split_commas(resp.get("Via") or "")[0]).params.get("branch")
        except (ValueError, IndexError):
            branch = None
        fut = self._uac.get(branch or "")
        if fut is None:
            self.stats.stray += 1
        elif resp.status >= 200 and not fut.done():
            fut.set_result(resp.status)


def _cache_key(req: M.SipMessage) -> tuple:
    via = M.split_commas(req.get("Via") or "")
    branch = M.parse_via(via[0]).params.get("branch") if via else None
    if branch and branch.startswith("z9hG4bK"):
        return (branch, req.method)
    return (req.get("Call-ID"), req.get("CSeq"), req.method)


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')[:200]


async def serve(cfg: BridgeConfig, stop: asyncio.Event | None = None) -> None:
    """Run the bridge until `stop` is set (or SIGINT/SIGTERM from __main__)."""
    bridge = Bridge(cfg)
    await bridge.start()
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await bridge.close()
        print(f"wave-sip: stopped ({bridge.stats.calls_ended} calls)", file=sys.stderr)
