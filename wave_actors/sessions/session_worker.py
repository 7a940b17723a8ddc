"""A session worker: a process of the node that runs SessionActors, off the beat clock's loop.

The front (`worker_pool.WorkerPool`) starts N of these and shards sessions across them. A worker
runs the sessions' host work — reorder, decode, resample, cut frames; resample, encode, text and
function-call parsing of their outputs — on its own asyncio loop and core. Its sessions' frames
go to the beat clock over ipc, batched (`FrameBatcher`; their samples written into the engine's
shared ring of frames once the clock has said where it lies, `shared_frames`), and what they
send their clients goes back to the front batched the same way (`worker_wire.sends`), which
routes it to the connection each session is bound to.

A worker holds no slot and no client connection: the front admits, binds, frees slots and
answers `closed`; the worker only asks (`closing`, `tokens`) and answers (`ended`, `drops`). If it dies, the front ends its sessions and starts another (`WorkerPool`).
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from transports import audio as A
from transports import zsock
from wave_actors.sessions import worker_wire as W
from wave_actors.core.sched.clock_policy import ClockPolicy
from wave_actors.core.frames import SAMPLES_OUT
from wave_actors.core.timebase import Clock, new_loop
from wave_actors.core.tasks import stop_tasks
from wave_actors.clock.frame_batch import FrameBatcher
from wave_actors.runtime.actors import (ActorStopped, ChildSpec, MailboxFull, MsgClass, Restart,
                                        Supervisor)
from wave_actors.clock.shared_outputs import BeatOut
from wave_actors.sessions.messages import AudioIn, Close, FunctionResult
from wave_actors.sessions.session import SessionActor
from wave_actors.clock.shared_frames import FramesView
from wave_actors.clock.shared_outputs import OutputsView

log = logging.getLogger("wave.worker")
PARENT_CHECK_S = 0.5           # how often a worker looks for its front having gone
# A worker's frames wait this long to share one message to the clock: the clock's loop reads
# each message, so fewer of them leave it more idle; a frame that then misses a beat's release
# waits in the jitter buffer for the next.
FRAMES_WAIT_S = 0.005


def frames_wait_s(policy: ClockPolicy) -> float:
    """How long a worker's frames wait to share a message: as long as the clock waits between
    its reads (a batch sent more often is read with the next one anyway, at the price of one
    more message), or FRAMES_WAIT_S where the clock reads each batch as it arrives."""
    return policy.frames_every_s or FRAMES_WAIT_S


class SessionWorker:
    def __init__(self, index: int, front: str, codecs: tuple, frames_wait: float = FRAMES_WAIT_S):
        self.index, self.front, self.frames_wait = index, front, frames_wait
        self.text_codec, self.user_codec = codecs
        self.clock = Clock()
        self.sessions: dict[int, SessionActor] = {}
        self.unknown = 0                          # messages for sessions this worker has not
        self.stale_rows = 0                       # beat rows refilled before they were copied
        self._views: dict[str, OutputsView] = {}  # the engine's shared outputs, mapped
        self._rings: dict[str, FramesView] = {}   # the engine's rings of frames, by endpoint
        self._batchers: dict[str, FrameBatcher] = {}
        self._clock_txs: list[zsock.Tx] = []       # the sockets to each clock (outputs, frames)
        self._out: list[tuple[int, bool, list[bytes]]] = []
        self._out_due = False
        # `audio` messages in `_out` whose payload is still samples, by (format, length).
        self._to_encode: dict[tuple[str, int], list[tuple[list, np.ndarray]]] = {}
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    async def run(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)       # the front's reads bound it; never drop here
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.connect(self.front)
        self.tx = zsock.Tx(self.sock)
        self.supervisor = Supervisor()
        self._ctrl("ready", self.index, os.getpid())
        loop = asyncio.get_running_loop()
        self._tasks += [loop.create_task(self._recv()), loop.create_task(self._watch_parent())]
        await self._stop.wait()
        await stop_tasks(self._tasks)
        await self.supervisor.stop_all()
        self._flush_out()
        for tx in [*self._clock_txs, self.tx]:
            tx.close(200)                    # their readers leave the loop first
        self.ctx.destroy(linger=200)

    async def _watch_parent(self) -> None:
        parent = os.getppid()
        while os.getppid() == parent:
            await asyncio.sleep(PARENT_CHECK_S)
        self._stop.set()                          # the front is gone: nothing to serve

    # -- to the front -----------------------------------------------------------------------------
    def _ctrl(self, *msg) -> None:
        self._flush_out()                         # in order with what the sessions sent before
        self.tx.send(W.ctrl(*msg))

    def _send_for(self, rid: int):
        def send(frames: list, droppable: bool = False) -> bool:
            self._out.append((rid, droppable, frames))
            if not self._out_due:
                self._out_due = True
                asyncio.get_running_loop().call_soon(self._flush_out)
            return True       # the front counts what its client could not take (`audio` rows)

        def send_pcm(header: list[bytes], pcm: np.ndarray, fmt: str) -> bool:
            """An `audio` message whose payload is encoded at the flush, with every other
            one of its format and length the sessions sent meanwhile, as one array."""
            frames = [*header, b""]
            self._to_encode.setdefault((fmt, len(pcm)), []).append((frames, pcm))
            return send(frames, True)
        send.pcm = send_pcm
        return send

    def _flush_out(self) -> None:
        self._out_due = False
        for (fmt, _n), group in self._to_encode.items():
            payloads = A.encode_rows(np.stack([pcm for _, pcm in group]), fmt)
            for (frames, _), payload in zip(group, payloads):
                frames[-1] = payload
        self._to_encode = {}
        if self._out:
            items, self._out = self._out, []
            self.tx.send(W.sends(items))

    def _batcher(self, endpoint: str) -> FrameBatcher:
        batcher = self._batchers.get(endpoint)
        if batcher is None:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 0)        # the beat's outputs: never dropped here
            # Named, so the clock sends this worker its sessions' outputs on the same socket.
            sock.setsockopt(zmq.IDENTITY, W.clock_identity(self.index, os.getpid()))
            sock.connect(endpoint)
            tx = zsock.Tx(sock)
            self._clock_txs.append(tx)
            batcher = self._batchers[endpoint] = FrameBatcher(tx, self.frames_wait)
            task = asyncio.get_running_loop().create_task(self._recv_outputs(tx, endpoint))
            self._tasks.append(task)
        return batcher

    # -- from the clock and the front --------------------------------------------------------------
    async def _recv_outputs(self, tx: zsock.Tx, endpoint: str) -> None:
        def on(parts: list) -> None:
            if parts[0] == W.FRAMES_AT:
                self._frames_at(endpoint, *parts[1:3])
            else:
                self._on(parts)
        await zsock.serve(tx, on, log, f"worker {self.index}: a beat's outputs")

    def _frames_at(self, endpoint: str, where, name) -> None:
        """The clock at `endpoint` says where its ring of frames lies (or that it has none): this
        worker's frames to it are written there from now on. A ring that cannot be mapped
        leaves the samples in the messages, as before."""
        slots, ring, name = W.read_frames_at(where, name)
        old = self._rings.get(endpoint)
        if old is not None and (old.name, old.slots, old.ring) == (name, slots, ring):
            return
        view = None
        if name:
            try:
                view = FramesView(name, slots, ring)
            except (OSError, ValueError) as exc:
                log.warning("worker %d: the clock's ring of frames could not be mapped (%r): "
                            "frames go with their samples", self.index, exc)
        self._batchers[endpoint].use_ring(view)
        if view is not None:
            self._rings[endpoint] = view
        else:
            self._rings.pop(endpoint, None)
        if old is not None:
            old.close()

    async def _recv(self) -> None:
        await zsock.serve(self.tx, self._on, log,
                          f"worker {self.index}: a message from the front")

    def _on(self, parts: list) -> None:
        kind = parts[0]
        if kind == W.AUDIO:
            for rid, seq, payload in W.read_audio(parts[1], parts[2]):
                actor = self.sessions.get(rid)
                if actor is None:
                    self.unknown += 1
                else:
                    self._tell_audio(actor, AudioIn(seq, payload))
        elif kind in (W.BEAT, W.BEAT_AT):
            if kind == W.BEAT:
                rows, pcm = W.read_beat(parts[1], parts[2], SAMPLES_OUT)
            else:
                rows, pcm = self._shared_rows(*parts[1:5])
                if pcm is None:
                    return
            for i, (rid, header) in enumerate(rows):
                actor = self.sessions.get(rid)
                if actor is None:
                    self.unknown += 1
                    continue
                self._tell_audio(actor, BeatOut(header, pcm[i]))
        elif kind == W.CTRL:
            self._on_ctrl(*W.read_ctrl(parts[1]))

    def _shared_rows(self, head, slots, where, name):
        """A beat's rows whose PCM lies in the engine's shared outputs: copied out now, before
        the buffer is refilled. Rows the engine already refilled are counted, never delivered."""
        rows, slots, at, frames = W.read_beat_at(head, slots, where, name)
        view = self._views.get(at["name"])
        pcm = None
        try:
            if view is None or (view.slots, view.depth) != (at["slots"], at["depth"]):
                for old in self._views.values():  # an engine restarted: its old segment is gone
                    old.close()
                self._views = {}
                view = self._views[at["name"]] = OutputsView(at["name"], at["slots"], at["depth"])
            pcm = view.take(at["index"], at["fill"], slots)
            pcm = None if pcm is None else pcm[:, frames]
        except (OSError, ValueError) as exc:     # the engine that sent it is gone, its segment too
            log.warning("worker %d: a beat's outputs could not be read: %r", self.index, exc)
        if pcm is None:
            self.stale_rows += len(rows)
            self._ctrl("stale", len(rows))
        return rows, pcm

    def _on_ctrl(self, op: str, *args: Any) -> None:
        if op == "stop":
            self._stop.set()
            return
        if op == "start":
            rid, cfg, endpoint = args
            self._start(rid, cfg, endpoint)
            return
        rid = args[0]
        actor = self.sessions.get(rid)
        if actor is None:
            self.unknown += 1
            if op in ("finish", "flush"):              # the front waits for an answer
                self._ctrl("gone", rid, op)
            return
        if op == "close":
            self._tell(actor, Close(args[1]))
        elif op == "func":
            self._tell(actor, FunctionResult(args[1], args[2]))
        elif op == "flooded":
            actor.count_flooded(b"\0" * args[1], args[2] if len(args) > 2 else None)
        elif op == "finish":
            actor.take_queued_audio()
            actor.flush_outputs()
            self._ctrl("ended", rid, actor.end_stream())
        elif op == "flush":
            actor.flush_input()
            self._ctrl("drops", rid, actor.input_drops())
            del self.sessions[rid]
            asyncio.get_running_loop().create_task(self.supervisor.stop_child(f"s{rid}"))

    def _tell_audio(self, actor: SessionActor, msg: Any) -> None:
        try:
            actor.tell(msg, MsgClass.AUDIO)
        except ActorStopped:
            self.unknown += 1

    @staticmethod
    def _tell(actor: SessionActor, msg: Any) -> None:
        try:
            actor.tell(msg)
        except (ActorStopped, MailboxFull):
            pass

    def _start(self, rid: int, cfg, endpoint: str) -> None:
        batcher = self._batcher(endpoint)

        def make() -> SessionActor:
            return SessionActor(cfg, lambda: batcher, self._send_for(rid), self.text_codec,
                                self.user_codec, self.clock, self._closing(rid),
                                self._tokens(rid))
        self.sessions[rid] = self.supervisor.start_child(ChildSpec(
            f"s{rid}", make, Restart.TEMPORARY, self._crashed(rid)))

    def _closing(self, rid: int):
        async def on_close(actor: SessionActor, why: Close) -> None:
            if actor.closing:
                return
            actor.closing = True
            self._ctrl("closing", rid, why.reason)
        return on_close

    def _crashed(self, rid: int):
        async def on_crash(actor: SessionActor, exc: BaseException) -> None:
            if actor.closing:
                return
            actor.closing = True
            self._ctrl("crashed", rid, type(exc).__name__)
        return on_crash

    def _tokens(self, rid: int):
        return lambda actor, ids: self._ctrl("tokens", rid, list(ids))


def worker_main(index: int, front: str, codecs: tuple, frames_wait: float = FRAMES_WAIT_S
                ) -> None:
    """A worker process's entry point (spawned by `WorkerPool`)."""
    logging.basicConfig(level=logging.WARNING)
    loop = new_loop()
    asyncio.set_event_loop(loop)
    # The collector stays on here (no beat clock collects between beats in a worker); what
    # exists at start is frozen out of its walks.
    gc.freeze()
    try:
        loop.run_until_complete(SessionWorker(index, front, codecs, frames_wait).run())
    finally:
        loop.close()
