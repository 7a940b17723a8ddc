"""The SIP side of the bridge: a user agent server on UDP and TCP (`tcp.py`) that turns each call
into a node session.

Each message goes through `intake.Intake`, which answers what it can (OPTIONS, retransmissions,
errors) and hands each remaining request to its method's handler here; an INVITE starts a task
that binds an RTP port, opens the node session and answers 200 OK with SDP. BYE and CANCEL are
answered synchronously. Retransmissions and timers live in `transaction.Transactions`.

Refused calls. A new call refused for capacity (`max_calls`, or the node's `refused capacity`)
gets `cfg.capacity_status` (503 by default, 486 by choice) with Retry-After `cfg.retry_after`.
Other refusals get 503; with Retry-After where trying again later can work (node draining or
not answering, no RTP port, shutdown, our transaction table full), without it where it cannot
(the node refuses our `open` as invalid or unauthorised: RFC 3261 §21.5.4 has a 503 without
Retry-After taken as a 500). A refusal of a well-formed INVITE is a proper INVITE server
transaction (To tag, resent until the ACK, retransmissions absorbed), so each refused call
leaves exactly one `call_refused` line in the event log (Call-ID, From, source, reason, status,
detail) and is counted in `stats.calls_refused` and, by reason, `stats.refusals`. A malformed
INVITE (400 before it could be read as one, 505) is answered statelessly: one line per copy.
"""
from __future__ import annotations

import asyncio
import sys
from typing import Callable

from transports import client as C
from transports.connect import connect_to
from transports.sip import message as M
from transports.sip import offers, sdp, sockbuf
from transports.sip.call import NODE_ERRORS, Call
from transports.sip.config import BridgeConfig
from transports.sip.dialog import Dialog, hostport, new_tag
from transports.sip.intake import ALLOW, Intake, SipProtocol
from transports.sip.keys import Keys
from transports.sip.media.pacer import Clock, MonotonicClock
from transports.sip.refusals import Refusals, warning
from transports.sip.stats import BridgeStats, print_event
from transports.sip.tcp import TcpListener, TcpPeer, listen_both, reliable
from transports.sip.transaction import InviteTx, Transactions, tx_key
from wave_actors.core.heap import Trimmer
from wave_actors.core.tasks import stop_tasks

class Bridge:
    def __init__(self, cfg: BridgeConfig, client: C.NodeClient | None = None,
                 emit: Callable[..., None] = print_event, clock: Clock | None = None):
        self.cfg, self.emit = cfg, emit
        self.clock = clock or MonotonicClock()
        self._own_client = client is None
        self.client = client or connect_to(cfg.node, cfg.fleet)
        self.stats = BridgeStats()
        self.transport: asyncio.DatagramTransport | None = None
        self.tx = Transactions(cfg, self.clock, self._send, self._spawn, self.stats)
        self.refusals = Refusals(cfg, self.tx, self.stats, emit)
        self.intake = Intake(self.tx, self.refusals, self.stats, self._send, emit, self._on_ack,
                             {"INVITE": self._on_invite, "BYE": self._on_bye,
                              "CANCEL": self._on_cancel, "INFO": self._on_info})
        self.keys = Keys(self.tx, self.stats, emit, self.clock)
        self.tcp = TcpListener(self.intake.on_message, emit, cfg.tcp_connections) \
            if cfg.tcp_connections else None
        self.dialogs: dict[tuple[str, str, str], Dialog] = {}
        self.calls: set[Call] = set()             # every call from INVITE to teardown
        self._tasks: set[asyncio.Task] = set()
        self._finishing: set[asyncio.Task] = set()     # calls being torn down
        self._housekeeper: asyncio.Task | None = None
        self.trimmer = Trimmer()        # an ended call's buffers freed: their pages go back

    # ------------------------------------------------------------------------- life cycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._own_client:
            self.client.connect()
        async def udp():
            return (await loop.create_datagram_endpoint(
                lambda: SipProtocol(self.intake), local_addr=(self.cfg.host, self.cfg.port)))[0]
        self.transport = await listen_both(udp, self.tcp, self.cfg.host, self.cfg.port)
        buffers = sockbuf.size_sip(self.transport.get_extra_info("socket"), self.cfg.sip_rcvbuf,
                                   self.cfg.sip_sndbuf, self.emit)
        self._housekeeper = loop.create_task(self._housekeeping())
        self.emit("listening", sip=self.address, node=self.cfg.node,
                  transports=["udp", "tcp"] if self.tcp else ["udp"],
                  **{b.name: b.granted for b in buffers})

    @property
    def address(self) -> tuple[str, int]:
        return self.transport.get_extra_info("sockname")[:2]

    async def close(self, timeout: float = 5.0) -> None:
        """Hang up every call (BYE, node close), then stop listening. Waits up to `timeout` for
        the BYEs to be answered; every other transaction is abandoned."""
        hangups = [self._spawn(self._hangup(d, "shutdown")) for d in list(self.dialogs.values())]
        for tx in list(self.tx.invites.values()):
            if tx.final is None and tx.task is not None:
                tx.task.cancel()
                self.refusals.refuse(tx.request, tx.addr, 503, "shutdown", tx=tx,
                                     headers=self.refusals.retry_after())
        ending = hangups + list(self._finishing)
        if ending:
            await asyncio.wait(ending, timeout=timeout)
        await stop_tasks(list(self._tasks))
        if self._housekeeper:
            self._housekeeper.cancel()
        self.trimmer.cancel()
        self.emit("stats", **self.stats.as_dict(),
                  **({"tcp": vars(self.tcp.stats)} if self.tcp else {}))
        if self.transport:
            self.transport.close()
        if self.tcp is not None:
            self.tcp.close()
        if self._own_client:
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
            self.tx.expire(self.clock.now())

    def _send(self, data: bytes, addr: tuple[str, int]) -> bool:
        if isinstance(addr, TcpPeer):       # back on the connection the peer's message came on
            return addr.conn.send(data)
        self.transport.sendto(data, addr)
        return True

    # ------------------------------------------------------------------------- requests

    def _on_invite(self, req: M.SipMessage, addr) -> None:
        if M.parse_name_addr(req.get("To")).tag is not None:
            self._on_reinvite(req, addr)
            return
        offer = self._check_offer(req, addr)
        if offer is False:
            return
        bad_contact = M.bad_contact(req.get("Contact"))
        if bad_contact:
            self.refusals.reject(req, addr, 400, "bad_request", [warning(399, bad_contact)],
                                 bad_contact)
            return
        self.stats.calls_offered += 1
        tx = InviteTx(req, addr, new_tag())
        if not self.tx.add_invite(tx):
            self.refusals.refuse(req, addr, 503, "overload", headers=self.refusals.retry_after(),
                                 detail="INVITE transaction table full", stateless=True)
            return
        if len(self.calls) >= self.cfg.max_calls:
            self.refusals.refuse(req, addr, self.cfg.capacity_status, "capacity", tx=tx,
                                 headers=self.refusals.retry_after(),
                                 detail=f"{len(self.calls)} calls, max_calls {self.cfg.max_calls}")
            return
        codec = offers.negotiate(self.cfg, offer, 0).codec if offer else sdp.PCMU
        tx.call = Call(self.cfg, req.get("Call-ID"), codec, self._on_call_end, self.clock,
                       signalling_host=addr[0], on_key=self.keys.from_rtp)
        self.calls.add(tx.call)
        self.tx.provisional(tx, 100)
        tx.task = self._spawn(self._answer(tx, offer))

    def _check_offer(self, req: M.SipMessage, addr) -> sdp.Session | None | bool:
        """The INVITE's SDP offer (None: none, we offer); False once answered with an error."""
        offer = offers.check(self.cfg, req)
        if isinstance(offer, offers.Refusal):
            self.refusals.reject(req, addr, *offer)
            return False
        return offer

    async def _answer(self, tx: InviteTx, offer: sdp.Session | None) -> None:
        """Bind RTP, open the node session, answer 200 OK with SDP (or refuse the call)."""
        call = tx.call
        try:
            refusal = await self._open_call(tx, call)
        except asyncio.CancelledError:                       # CANCEL or shutdown
            self._discard(call)
            raise
        if refusal is not None:
            status, reason, headers, detail = refusal
            self.refusals.refuse(tx.request, tx.addr, status, reason, tx=tx, headers=headers,
                                 detail=detail)
            return self._discard(call)
        try:
            self._establish(tx, call, offer)
        except Exception:
            # A bug of ours after the node session opened: the caller hears 500 and the call
            # (its RTP port, its node session, its place under max_calls) ends, never lingers.
            if tx.final is None:
                self.refusals.refuse(tx.request, tx.addr, 500, "internal", tx=tx,
                                     detail="the call could not be set up")
            self.calls.discard(call)
            call.stop("internal_error")
            raise                                  # counted and logged by _task_done

    async def _open_call(self, tx: InviteTx, call: Call) -> tuple | None:
        """Bind RTP and open the node session: None when both worked, else the refusal
        (status, reason, headers, detail)."""
        try:
            await call.bind()
        except OSError as exc:
            return 503, "no_rtp_port", [*self.refusals.retry_after(), warning(
                399, "no RTP port available")], str(exc)
        self.tx.provisional(tx, 180, self._dialog_headers(tx.request, tx.addr))
        try:
            await call.open_node(self.client)
        except C.Refused as exc:
            return self.refusals.node_refusal(exc)
        except NODE_ERRORS as exc:
            return 503, "node_unavailable", [*self.refusals.retry_after(), warning(
                399, f"{type(exc).__name__}: node unavailable")], repr(exc)
        return None

    def _establish(self, tx: InviteTx, call: Call, offer: sdp.Session | None) -> None:
        req, session_id = tx.request, int(call.session_id[4:12], 16)
        answer, body = offers.answer_sdp(self.cfg, call.codec, call.local_port, offer,
                                         session_id, 1)
        tx.offered = answer is None
        frm, contact = M.parse_name_addr(req.get("From")), M.parse_name_addr(req.get("Contact"))
        dialog = Dialog(req.get("Call-ID"), tx.local_tag, frm.tag or "",
                        f"{req.get('To')};tag={tx.local_tag}", req.get("From"), contact.uri,
                        req.get_all("Record-Route"), tx.addr,
                        M.parse_cseq(req.get("CSeq"))[0], call)
        tx.dialog = dialog
        self.dialogs[dialog.key] = dialog
        self.tx.final(tx, 200, body=body, headers=self._dialog_headers(req, tx.addr),
                      on_no_ack=self._ack_timeout)
        self.stats.calls_answered += 1
        call.start(answer)
        self.emit("call_start", call_id=call.sip_call_id, session=call.session_id,
                  codec=call.codec.name, remote=answer.remote if answer else None,
                  rtp_port=call.local_port)

    def _dialog_headers(self, req: M.SipMessage, addr) -> list[tuple[str, str]]:
        contact = hostport(self.cfg.rtp_ip, self.address[1])
        if reliable(addr):                  # the caller's in-dialog requests come over TCP too
            contact += ";transport=tcp"
        return [("Contact", f"<sip:wave@{contact}>"), ("Allow", ALLOW),
                *(("Record-Route", rr) for rr in req.get_all("Record-Route"))]

    def _discard(self, call: Call) -> None:
        self.calls.discard(call)
        if call.transport is not None:
            call.transport.close()

    async def _ack_timeout(self, tx: InviteTx) -> None:
        if tx.final == 200 and tx.dialog is not None:
            self.stats.ack_timeouts += 1
            await self._hangup(tx.dialog, "ack_timeout")

    def _on_ack(self, req: M.SipMessage) -> None:
        tx = self.tx.invites.get(tx_key(req))
        if tx is None or tx.final is None:
            self.stats.stray += 1
            return
        tx.acked.set()
        dialog = tx.dialog
        if tx.final != 200 or dialog is None:
            return
        dialog.confirmed = True
        if tx.offered and req.body:                      # our offer's answer
            try:
                answer = offers.negotiate(self.cfg, sdp.parse(req.body), dialog.call.local_port,
                                         0, 1)
                if answer.codec.name != dialog.call.codec.name:
                    raise sdp.NotAcceptable("the answer changed the codec")
            except (sdp.SdpError, sdp.NotAcceptable):
                self._spawn(self._hangup(dialog, "bad_answer"))
                return
            dialog.call.update(answer)

    def _in_dialog(self, req: M.SipMessage, addr, reject_ending: bool = False):
        """The dialog an in-dialog request belongs to, its CSeq accepted; None once answered
        (481 for no such dialog, 500 for a CSeq out of order)."""
        dialog = self._dialog_of(req)
        if dialog is None or (reject_ending and dialog.ending):
            self.tx.respond(req, addr, 481)
            return None
        cseq = M.parse_cseq(req.get("CSeq"))[0]
        if cseq <= dialog.remote_cseq:
            self.tx.respond(req, addr, 500, "CSeq Out of Order")
            return None
        dialog.remote_cseq = cseq
        return dialog

    def _on_info(self, req: M.SipMessage, addr) -> None:
        dialog = self._in_dialog(req, addr)
        if dialog is not None:
            self.keys.from_info(req, addr, dialog.call)

    def _on_reinvite(self, req: M.SipMessage, addr) -> None:
        dialog = self._in_dialog(req, addr, reject_ending=True)
        if dialog is None:
            return
        cseq = dialog.remote_cseq
        offer = self._check_offer(req, addr)
        if offer is False:
            return
        call = dialog.call
        tx = InviteTx(req, addr, dialog.local_tag, call=call, dialog=dialog)
        if not self.tx.add_invite(tx):
            self.tx.respond(req, addr, 503, headers=self.refusals.retry_after())
            return
        answer, body = offers.answer_sdp(self.cfg, call.codec, call.local_port, offer,
                                         int(call.session_id[4:12], 16), cseq)
        if answer is not None and answer.codec.name != call.codec.name:
            self.tx.final(tx, 488, headers=[warning(305, "codec change not supported")])
            return
        tx.offered = answer is None
        self.tx.final(tx, 200, body=body, headers=self._dialog_headers(req, tx.addr),
                      on_no_ack=self._ack_timeout)
        if answer is not None:
            call.update(answer)

    def _on_cancel(self, req: M.SipMessage, addr) -> None:
        tx = self.tx.invites.get(tx_key(req))
        if tx is None or tx.request.get("From") != req.get("From"):
            self.tx.respond(req, addr, 481)
            return
        self.tx.respond(req, addr, 200, to_tag=tx.local_tag)
        if tx.final is None:
            self.stats.calls_cancelled += 1
            if tx.task is not None:
                tx.task.cancel()
            self.tx.final(tx, 487)

    def _on_bye(self, req: M.SipMessage, addr) -> None:
        dialog = self._in_dialog(req, addr)
        if dialog is None:
            return
        self.tx.respond(req, addr, 200)
        for tx in self.tx.invites.values():
            if tx.dialog is dialog:
                tx.acked.set()                  # a BYE ends the wait for the ACK too
        self.dialogs.pop(dialog.key, None)      # later requests in it get 481
        if not dialog.ending:
            dialog.ending = True
            self._finish_soon(dialog, "bye")

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
        """Our BYE: the node session is closed at once, the BYE retransmitted until answered."""
        if dialog.ending:
            return
        dialog.ending = True
        finish = self._finish_soon(dialog, reason)
        bye, dest = dialog.request("BYE", self.cfg.rtp_ip, self.address[1]), dialog.destination()
        if reliable(dialog.peer) and not reliable(dest):    # the caller closed its connection
            dest = await self.tcp.dial(*dest)
        status = None if dest is None else await self.tx.request(bye, dest)
        self.emit("bye_sent", call_id=dialog.call_id, reason=reason, status=status)
        await finish

    def _finish_soon(self, dialog: Dialog, reason: str) -> asyncio.Task:
        task = self._spawn(self._finish(dialog, reason))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)
        return task

    async def _finish(self, dialog: Dialog, reason: str) -> None:
        summary = await dialog.call.stop(reason)
        self.dialogs.pop(dialog.key, None)
        self.calls.discard(dialog.call)
        self.stats.calls_ended += 1
        self.trimmer.soon()
        self.emit("call_end", **summary)


async def serve(cfg: BridgeConfig, stop: asyncio.Event | None = None) -> None:
    """Run the bridge until `stop` is set (SIGINT/SIGTERM in __main__)."""
    bridge = Bridge(cfg)
    await bridge.start()
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await bridge.close()
        print(f"wave-sip: stopped after {bridge.stats.calls_ended} calls", file=sys.stderr)
