"""Persistent-kernel code on the CPU: every program of a grid on a thread of its own under Triton's
interpreter (WPK.md §6.2).

The stock interpreter runs a grid's programs one after another, so a program that waits for a
later one spins forever. Here each program runs on its own Python thread and the interpreter's
"which program am I" is per thread; the GIL interleaves the threads, so waits on counters that
other programs signal complete. What this tests is dependencies and protocol (who waits for
whom, epochs, counts), not weak memory ordering: under the GIL every interleaving is
sequentially consistent. A run that does not finish in `timeout_s` is stopped (every program's
next atomic raises) and reported as a deadlock.

Uses interpreter internals of Triton 3.6 (`GridExecutor`'s argument copies, its language patch,
`InterpreterBuilder.grid_idx`): checked against the version, as WPK.md §3 pitfall 9 asks.
"""
from __future__ import annotations

import contextlib
import inspect
import threading

import triton

SUPPORTED = ("3.6",)


class Deadlock(RuntimeError):
    """Programs still waiting when the run's time was up."""


class _Stopped(RuntimeError):
    pass


def _interpreter():
    from triton.runtime import interpreter
    if not triton.__version__.startswith(SUPPORTED):
        raise RuntimeError(f"gpu.wpk.testing knows Triton {SUPPORTED}'s interpreter, not "
                           f"{triton.__version__}")
    return interpreter


@contextlib.contextmanager
def _per_thread_program(interp, stop: threading.Event):
    """The builder's program index kept per thread, and its atomics stopped on request (a
    spinning program then raises instead of spinning on)."""
    cls = interp.InterpreterBuilder
    local = threading.local()
    rmw, cas = cls.create_atomic_rmw, cls.create_atomic_cas

    def get(self):
        return getattr(local, "idx", None)

    def put(self, value):
        local.idx = value

    def checked(fn):
        def call(self, *args):
            if stop.is_set():
                raise _Stopped("stopped: the run timed out")
            return fn(self, *args)
        return call

    cls.grid_idx = property(get, put)
    cls.create_atomic_rmw, cls.create_atomic_cas = checked(rmw), checked(cas)
    try:
        yield
    finally:
        del cls.grid_idx
        cls.create_atomic_rmw, cls.create_atomic_cas = rmw, cas


def threaded(kernel, grid: tuple, *args, timeout_s: float = 60.0, **kwargs) -> None:
    """`kernel[grid](*args, **kwargs)` with each program on its own thread (interpreter only).
    Raises `Deadlock` when programs are still running after `timeout_s`, and the first
    program's error if one failed."""
    interp = _interpreter()
    assert isinstance(kernel, interp.InterpretedFunction), \
        "threaded runs need TRITON_INTERPRET=1 (set before triton is imported)"
    ex = interp.GridExecutor(kernel.rewrite(), kernel.arg_names, grid, kernel.pre_run_hooks)
    known = inspect.getfullargspec(ex.fn).args
    kwargs = {k: v for k, v in kwargs.items() if k in known}
    args_hst, kwargs_hst = ex._init_args_hst(args, kwargs)
    grid = tuple(grid) + (1,) * (3 - len(grid))
    stop = threading.Event()
    errors: list[BaseException] = []
    patch = interp._patch_lang(ex.fn)
    try:
        call = inspect.getcallargs(ex.fn, *args_hst, **kwargs_hst)
        call = {name: value if name in ex.constexprs else interp._implicit_cvt(value)
                for name, value in call.items()}
        builder = interp.interpreter_builder
        builder.set_grid_dim(*grid)
        with _per_thread_program(interp, stop):
            def program(x: int, y: int, z: int) -> None:
                try:
                    builder.set_grid_idx(x, y, z)
                    ex.fn(**call)
                except BaseException as exc:          # reported by the caller's thread
                    errors.append(exc)

            threads = [threading.Thread(target=program, args=(x, y, z), daemon=True,
                                        name=f"program-{x}.{y}.{z}")
                       for x in range(grid[0]) for y in range(grid[1]) for z in range(grid[2])]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout_s)
                if t.is_alive():
                    break
            waiting = [t.name for t in threads if t.is_alive()]
            if waiting:
                stop.set()
                for t in threads:
                    t.join(10.0)
                raise Deadlock(f"{len(waiting)} of {len(threads)} programs still running after "
                               f"{timeout_s} s: {', '.join(waiting[:8])}")
    finally:
        patch.restore()
    real = [e for e in errors if not isinstance(e, _Stopped)]
    if real:
        raise real[0]
    ex._restore_args_dev(args, args_hst, kwargs, kwargs_hst)
