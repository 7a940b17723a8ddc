"""Small kernels built only from `gpu.wpk.sync`: what the tests run in the threaded interpreter,
compile for sm_90 on the CPU, and run on the device. Each exercises one use the persistent
kernel makes of the primitives.

- `chain`: program p waits for program p + 1 (the reverse of the stock interpreter's order, so
  it only finishes when programs run together), adds to its value, and signals p's counter.
- `rounds`: every program writes, meets the others at a grid barrier, reads what all wrote,
  meets them again; `rounds` times on one counter that is never reset (epoch targets).
- `doorbell`: one program answers a host's doorbell (int64 in host-visible memory) beat by beat
  with a release store, stamping the GPU clock: the mailbox's round trip in miniature.
"""
from __future__ import annotations

import triton
import triton.language as tl

from gpu.wpk.sync import globaltimer, grid_barrier, signal, st_release_sys, wait_ge, wait_ge_sys


@triton.jit
def chain(values, counters, out, n_programs, IS_INTERP: tl.constexpr):
    p = tl.program_id(0)
    mine = tl.load(values + p)
    if p + 1 < n_programs:
        wait_ge(counters + p + 1, 1, IS_INTERP)
        tl.debug_barrier()
        mine += tl.load(out + p + 1)
    tl.store(out + p, mine)
    signal(counters + p, IS_INTERP)


@triton.jit
def rounds(counter, slots, out, n_programs, n_rounds, BLOCK: tl.constexpr,
           IS_INTERP: tl.constexpr):
    p = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    r = 0
    while r < n_rounds:
        tl.store(slots + p, r * 1000 + p)
        grid_barrier(counter, 2 * r + 1, n_programs, IS_INTERP)
        seen = tl.load(slots + offs, mask=offs < n_programs, other=0)
        tl.store(out + r * n_programs + p, tl.sum(seen, axis=0))
        grid_barrier(counter, 2 * r + 2, n_programs, IS_INTERP)   # reads done before rewrites
        r += 1


@triton.jit
def doorbell(bell, ack, stamps, n_beats, IS_INTERP: tl.constexpr):
    e = tl.full((), 1, tl.int64)
    while e <= n_beats:
        rung = wait_ge_sys(bell, e, IS_INTERP)
        tl.store(stamps + e - 1, globaltimer(IS_INTERP))
        st_release_sys(ack, rung, IS_INTERP)
        e = rung + 1
