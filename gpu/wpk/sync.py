"""Device-side synchronisation for the persistent-kernel work (docs/WPK.md): acquire loads,
release stores and signals, waits on epoch counters, a grid barrier, and the GPU's nanosecond
clock. Called from `@triton.jit` code; each takes `IS_INTERP`, a constexpr that selects a
plain-Triton branch for the CPU interpreter (which has no inline PTX).

Why inline PTX: Triton 3.6 has no atomic load (`tl.atomic_poll`/`tl.atomic_load` came later),
and an `atomic_add(ptr, 0)` poll is a read-modify-write that bounces the line between SMs.
`ld.acquire` is a plain load with acquire order: many programs can spin on one word cheaply.
`.gpu` scope orders against other programs on the device; `.sys` against the host (a mailbox in
mapped pinned memory), which only one program should poll (PCIe round trips).

Counters are epoch counters: nothing is reset between uses. A counter that `n` programs signal
once per epoch is waited for with target `n * epoch`, so a reset can never race a late reader.

Rules for callers: a wait is `wait_ge` then `tl.debug_barrier()` (the whole program waits for
the one thread's load); a signal is `signal` (barrier first, so every thread's stores are done,
then one release add). Every program a wait depends on must be resident: launch with
`launch_cooperative_grid=True` on a device, or run programs on threads in the interpreter
(`tests.kernels.wpk_threads.threaded`).
"""
from __future__ import annotations

import os

import triton
import triton.language as tl



@triton.jit
def ld_acquire_gpu(ptr, IS_INTERP: tl.constexpr):
    """The int32 at `ptr`, loaded with acquire order at GPU scope."""
    if IS_INTERP:
        return tl.atomic_add(ptr, 0, sem="acquire")
    else:
        return tl.inline_asm_elementwise("ld.global.acquire.gpu.b32 $0, [$1];", "=r,l", [ptr],
                                         dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def ld_acquire_sys(ptr, IS_INTERP: tl.constexpr):
    """The int64 at `ptr` (host-mapped pinned memory), loaded with acquire order at system
    scope: what the host stored before it is visible after it."""
    if IS_INTERP:
        return tl.atomic_add(ptr, 0, sem="acquire")
    else:
        return tl.inline_asm_elementwise("ld.global.acquire.sys.b64 $0, [$1];", "=l,l", [ptr],
                                         dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def st_release_sys(ptr, value, IS_INTERP: tl.constexpr):
    """Stores int64 `value` at `ptr` with release order at system scope: the host that sees it
    sees every store of this thread before it."""
    if IS_INTERP:
        tl.atomic_xchg(ptr, value, sem="release")
    else:
        tl.inline_asm_elementwise("st.global.release.sys.b64 [$1], $2; mov.u32 $0, 0;",
                                  "=r,l,l", [ptr, value.to(tl.int64)],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def backoff(IS_INTERP: tl.constexpr):
    """A short sleep between polls (20 ns): spinners leave issue slots to the programs doing
    work beside them."""
    if not IS_INTERP:
        tl.inline_asm_elementwise("nanosleep.u32 20; mov.u32 $0, 0;", "=r", [],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def globaltimer(IS_INTERP: tl.constexpr):
    """The GPU's global nanosecond clock (int64); 0 in the interpreter (stamps are checked on
    the device only)."""
    if IS_INTERP:
        return tl.full((), 0, tl.int64)
    else:
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [],
                                         dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def wait_ge(ptr, target, IS_INTERP: tl.constexpr):
    """Spins until the int32 counter at `ptr` is at least `target` (acquire, GPU scope); returns
    the value seen. Follow with `tl.debug_barrier()` before the program reads what it guards."""
    seen = ld_acquire_gpu(ptr, IS_INTERP)
    while seen < target:
        backoff(IS_INTERP)
        seen = ld_acquire_gpu(ptr, IS_INTERP)
    return seen


@triton.jit
def wait_ge_sys(ptr, target, IS_INTERP: tl.constexpr):
    """`wait_ge` on an int64 word the host writes (a doorbell in mapped pinned memory)."""
    seen = ld_acquire_sys(ptr, IS_INTERP)
    while seen < target:
        backoff(IS_INTERP)
        seen = ld_acquire_sys(ptr, IS_INTERP)
    return seen


@triton.jit
def signal(ptr, IS_INTERP: tl.constexpr):
    """Adds 1 to the int32 counter at `ptr` once for the program, after all of its threads'
    stores (a CTA barrier, then one release add at GPU scope)."""
    tl.debug_barrier()
    tl.atomic_add(ptr, 1, sem="release", scope="gpu")


@triton.jit
def grid_barrier(ptr, epoch, n_programs, IS_INTERP: tl.constexpr):
    """Every one of `n_programs` programs arrives at the counter at `ptr` for barrier `epoch`
    (1, 2, ... ; the counter starts at 0 and is never reset) and leaves once all have."""
    signal(ptr, IS_INTERP)
    wait_ge(ptr, epoch * n_programs, IS_INTERP)
    tl.debug_barrier()


def interp() -> bool:
    """The `IS_INTERP` to pass: true when Triton runs kernels on the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
