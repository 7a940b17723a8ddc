"""The mailbox between the beat clock and a resident controller program.

One int64 block in host-visible memory (page-locked and mapped on a GPU; a CPU tensor under the
interpreter), its words grouped in 128-byte lines by writer so the host and the device never
write one line:

    line 0 (host)    DOORBELL: the sequence number of the last ring (1, 2, ...)
    lines 1..K (host) the ring of K descriptors, ring `seq` in slot seq % K:
                     OP (RUN, DRAIN, EXIT), the beat's number, its live rows
    line K+1 (device) ACK: the last ring whose descriptor was read (its slot is free again);
                     STATE: RUNNING, or the op it left on (DRAIN, EXIT), or FAILED;
                     BEAT_DONE, FRAME_DONE[2]: the last ring whose beat / frame is done;
                     ERR_CODE, ERR_SEQ; HEARTBEAT (the GPU clock, or polls under the
                     interpreter, while it waits)
    lines K+2.. (device) per slot: stamps (doorbell seen, work released, frame 0 done,
                     frame 1 done) on the GPU clock

A ring: the host waits until the slot is free (ACK ≥ seq − K: back-pressure), writes the
descriptor, then the doorbell, with plain stores (x86 keeps their order: the device that sees
the doorbell sees the descriptor). The controller (`controller`, one program) polls the
doorbell with acquire loads, acknowledges, and for RUN releases the beat's work by storing the
run count to a device word the work waits on (on a GPU: graphs held by `cuStreamWaitValue32`;
in tests: programs of the same grid, `lane`), then waits for each frame's completion counter
and publishes FRAME_DONE and BEAT_DONE with release stores. DRAIN (for maintenance: captures,
module loads) and EXIT end the program after the work already released; EXIT also tells the
work to stop. A frame not done within the timeout sets ERR_CODE/ERR_SEQ and FAILED and ends the
program: the host's watchdog then falls back.

Nothing is ever reset: counters are epoch targets (`gpu.wpk.sync`), so a relaunched controller
continues from the words as they are (`Mailbox.relaunch_args`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from gpu.wpk.sync import backoff, globaltimer, ld_acquire_gpu, ld_acquire_sys, st_release_sys

LINE = 16                                   # int64 words in a 128-byte line
K_SLOTS = 4                                 # descriptors in flight at most

RUN, DRAIN, EXIT = 1, 2, 3                  # descriptor ops
RUNNING, FAILED = 0, 4                      # STATE besides DRAIN/EXIT (the op it left on)
LANE_TIMEOUT = 1                            # ERR_CODE
STOP = 1 << 30                              # the work word's value that ends the work

# Word offsets (int64), constexprs for the kernels.
DOORBELL = tl.constexpr(0)
DESC = tl.constexpr(LINE)                   # slot s at DESC + s * LINE: op, beat, live
DEV = LINE * (1 + K_SLOTS)
ACK = tl.constexpr(DEV + 0)
STATE = tl.constexpr(DEV + 1)
BEAT_DONE = tl.constexpr(DEV + 2)
FRAME_DONE = tl.constexpr(DEV + 3)          # two words
ERR_CODE = tl.constexpr(DEV + 5)
ERR_SEQ = tl.constexpr(DEV + 6)
HEARTBEAT = tl.constexpr(DEV + 7)
STAMPS = tl.constexpr(DEV + LINE)           # slot s at STAMPS + s * LINE: 4 stamps
WORDS = DEV + LINE * (1 + K_SLOTS)
K = tl.constexpr(K_SLOTS)
C_LINE = tl.constexpr(LINE)
C_RUN, C_EXIT, C_FAILED = tl.constexpr(RUN), tl.constexpr(EXIT), tl.constexpr(FAILED)
C_TIMEOUT, C_STOP = tl.constexpr(LANE_TIMEOUT), tl.constexpr(STOP)
HEARTBEAT_POLLS = tl.constexpr(1024)        # polls between heartbeats while idle
SPIN_S = 0.002                              # the host spins this long before it sleeps


@triton.jit
def _clock(polls, IS_INTERP: tl.constexpr):
    """Nanoseconds on the GPU clock; under the interpreter a poll counts as one microsecond."""
    if IS_INTERP:
        return polls.to(tl.int64) * 1000
    else:
        return globaltimer(IS_INTERP)


@triton.jit
def _wait_frame(ctr, target, timeout_ns, IS_INTERP: tl.constexpr):
    """Whether the int32 counter at `ctr` reached `target` within `timeout_ns`."""
    polls = tl.full((), 0, tl.int64)
    start = _clock(polls, IS_INTERP)
    seen = ld_acquire_gpu(ctr, IS_INTERP)
    late = tl.full((), 0, tl.int32)
    while (seen < target) & (late == 0):
        backoff(IS_INTERP)
        polls += 1
        late = (_clock(polls, IS_INTERP) - start > timeout_ns).to(tl.int32)
        seen = ld_acquire_gpu(ctr, IS_INTERP)
    return seen >= target


# Arguments that vary between launches are never specialised on: a relaunch after DRAIN must
# find its binary loaded (a module load while the work is resident never returns).
VARYING = ["n_lanes", "first_seq", "runs", "timeout_ns"]


@triton.jit(do_not_specialize=VARYING)
def controller(box, work, args, frame_ctr, n_lanes, first_seq, runs, timeout_ns,
               IS_INTERP: tl.constexpr):
    """The resident controller: one program. `work` (int32): the run count the work waits on;
    `args` (int32): the beat's live rows, for the work; `frame_ctr` (int32 [2]): each frame's
    completions (each of `n_lanes` lanes adds one a frame a run). `first_seq`, `runs`: where a
    relaunch continues (1 and 0 at the first launch)."""
    seq = tl.full((), 0, tl.int64) + first_seq
    runs = tl.full((), 0, tl.int32) + runs
    state = tl.full((), 0, tl.int64)
    polls = tl.full((), 0, tl.int64)
    while state == 0:
        rung = ld_acquire_sys(box + DOORBELL, IS_INTERP)
        while rung < seq:
            backoff(IS_INTERP)
            polls += 1
            if polls % HEARTBEAT_POLLS == 0:
                tl.store(box + HEARTBEAT, _clock(polls, IS_INTERP))
            rung = ld_acquire_sys(box + DOORBELL, IS_INTERP)
        slot = seq % K
        stamps = box + STAMPS + slot * C_LINE
        tl.store(stamps, _clock(polls, IS_INTERP))
        op = tl.load(box + DESC + slot * C_LINE)
        live = tl.load(box + DESC + slot * C_LINE + 2)
        st_release_sys(box + ACK, seq, IS_INTERP)          # the slot may be written again
        if op == C_RUN:
            runs += 1
            tl.store(args, live.to(tl.int32))
            tl.atomic_xchg(work, runs, sem="release", scope="gpu")
            tl.store(stamps + 1, _clock(polls, IS_INTERP))
            f = 0
            while (f < 2) & (state == 0):
                if _wait_frame(frame_ctr + f, runs * n_lanes, timeout_ns, IS_INTERP):
                    tl.store(stamps + 2 + f, _clock(polls, IS_INTERP))
                    st_release_sys(box + FRAME_DONE + f, seq, IS_INTERP)
                else:
                    tl.store(box + ERR_CODE, C_TIMEOUT)
                    tl.store(box + ERR_SEQ, seq)
                    state = state * 0 + C_FAILED
                    st_release_sys(box + STATE, state, IS_INTERP)
                f += 1
            if state == 0:
                st_release_sys(box + BEAT_DONE, seq, IS_INTERP)
        else:
            if op == C_EXIT:
                tl.atomic_xchg(work, C_STOP, sem="release", scope="gpu")
            st_release_sys(box + STATE, op, IS_INTERP)
            state = op
        seq += 1


@triton.jit
def lane(lane_id, work, args, frame_ctr, out, n_lanes, max_runs, IS_INTERP: tl.constexpr):
    """A stand-in for a lane of the beat's work (a graph on a GPU): each run, for each frame,
    writes `live * 100 + frame * 10 + lane` at out[run - 1, frame, lane] and signals."""
    r = 1
    go = ld_acquire_gpu(work, IS_INTERP)
    while go < C_STOP:
        while go < r:
            backoff(IS_INTERP)
            go = ld_acquire_gpu(work, IS_INTERP)
        if go < C_STOP:
            tl.debug_barrier()
            live = tl.load(args)
            for f in range(2):
                if r <= max_runs:
                    tl.store(out + ((r - 1) * 2 + f) * n_lanes + lane_id,
                             live * 100 + f * 10 + lane_id)
                tl.debug_barrier()
                tl.atomic_add(frame_ctr + f, 1, sem="release", scope="gpu")
            r += 1


@triton.jit
def lane_grid(work, args, frame_ctr, out, n_lanes, max_runs, IS_INTERP: tl.constexpr):
    """The stand-in lanes alone, program p lane p (beside a controller launched apart)."""
    lane(tl.program_id(0), work, args, frame_ctr, out, n_lanes, max_runs, IS_INTERP)


@triton.jit(do_not_specialize=VARYING + ["max_runs"])
def controller_and_lanes(box, work, args, frame_ctr, out, n_lanes, max_runs, first_seq, runs,
                         timeout_ns, IS_INTERP: tl.constexpr):
    """Program 0 is the controller, programs 1..n_lanes the work (tests, and the device probe)."""
    p = tl.program_id(0)
    if p == 0:
        controller(box, work, args, frame_ctr, n_lanes, first_seq, runs, timeout_ns, IS_INTERP)
    else:
        lane(p - 1, work, args, frame_ctr, out, n_lanes, max_runs, IS_INTERP)


class MailboxTimeout(RuntimeError):
    """The controller did not answer in time (see `Mailbox.error`)."""


@dataclass
class Ring:
    seq: int
    op: int


class Mailbox:
    """The host's side: rings, back-pressure, completion polls, the error word. Every access is
    a plain load or store on a numpy view of the block (no CUDA call: a watchdog thread can
    ring EXIT even while another thread is stuck in the driver)."""

    def __init__(self, device: str = "cpu"):
        pinned = device != "cpu"
        self.block = torch.zeros(WORDS, dtype=torch.int64, pin_memory=pinned)
        self.words = self.block.numpy()
        self.seq = 0                        # the last ring

    # -- ringing ------------------------------------------------------------------------------
    def ring(self, op: int, beat: int = 0, live: int = 0, timeout_s: float = 1.0) -> Ring:
        """Writes the next descriptor and rings; waits first (up to `timeout_s`) while the slot
        still holds a ring the controller has not read."""
        seq = self.seq + 1
        self._wait(lambda: self.words[ACK.value] >= seq - K_SLOTS, timeout_s,
                   f"slot of ring {seq} still unread")
        at = DESC.value + (seq % K_SLOTS) * LINE
        self.words[at:at + 3] = (op, beat, live)
        self.words[DOORBELL.value] = seq    # last: the descriptor is visible before it
        self.seq = seq
        return Ring(seq, op)

    def run(self, beat: int, live: int, timeout_s: float = 1.0) -> Ring:
        return self.ring(RUN, beat, live, timeout_s)

    # -- completion ---------------------------------------------------------------------------
    def frame_done(self, ring: Ring, frame: int) -> bool:
        return self.words[FRAME_DONE.value + frame] >= ring.seq

    def beat_done(self, ring: Ring) -> bool:
        return self.words[BEAT_DONE.value] >= ring.seq

    def wait_frame(self, ring: Ring, frame: int, timeout_s: float = 1.0) -> None:
        self._wait(lambda: self.frame_done(ring, frame), timeout_s,
                   f"frame {frame} of ring {ring.seq}")

    def wait_beat(self, ring: Ring, timeout_s: float = 1.0) -> None:
        self._wait(lambda: self.beat_done(ring), timeout_s, f"ring {ring.seq}")

    def wait_state(self, state: int, timeout_s: float = 1.0) -> None:
        self._wait(lambda: self.words[STATE.value] == state, timeout_s, f"state {state}")

    # -- the controller's words ---------------------------------------------------------------
    @property
    def state(self) -> int:
        return int(self.words[STATE.value])

    def error(self) -> tuple[int, int] | None:
        """(code, ring) of the controller's failure, if it failed."""
        code = int(self.words[ERR_CODE.value])
        return (code, int(self.words[ERR_SEQ.value])) if code else None

    def heartbeat(self) -> int:
        return int(self.words[HEARTBEAT.value])

    def stamps(self, ring: Ring) -> np.ndarray:
        """[doorbell seen, work released, frame 0 done, frame 1 done] of a ring (its slot's,
        until the slot is used again)."""
        at = STAMPS.value + (ring.seq % K_SLOTS) * LINE
        return self.words[at:at + 4].copy()

    def relaunch_args(self, runs: int) -> tuple[int, int]:
        """(first_seq, runs) for a controller launched after a DRAIN: it continues with the
        next ring and the run count the work has reached. (The one host write to the device's
        line, made while no controller runs.)"""
        self.words[STATE.value] = RUNNING
        return self.seq + 1, runs

    def _wait(self, ok, timeout_s: float, what: str) -> None:
        """Spins for the answer (a beat's words arrive within microseconds; even a zero sleep
        costs the kernel's timer slack, ~50 µs), then polls with short sleeps."""
        if ok():
            return
        start = time.perf_counter()
        spin_until, deadline = start + SPIN_S, start + timeout_s
        while not ok():
            now = time.perf_counter()
            if now > deadline:
                raise MailboxTimeout(f"{what}: no answer in {timeout_s} s "
                                     f"(state {self.state}, error {self.error()})")
            if now > spin_until:
                time.sleep(1e-4)
