"""Persistent-kernel code on the CPU: every program of a grid on a thread of its own under Triton's
interpreter.

The stock interpreter runs a grid's programs one after another, so a program that waits for a
later one spins forever. Here each program runs on its own Python thread and the interpreter's
"which program am I" is per thread; the GIL interleaves the threads, so waits on counters that
other programs signal complete. What this tests is dependencies and protocol (who waits for
whom, epochs, counts), not weak memory ordering: under the GIL every interleaving is
sequentially consistent. A run that does not finish in `timeout_s` is stopped (every program's
next atomic raises) and reported as a deadlock.

Uses interpreter internals of Triton 3.6 (`GridExecutor`'s argument copies, its language patch,
`InterpreterBuilder.grid_idx`): checked against the version, since they change between versions.
"""
from __future__ import annotations

import inspect
import threading
import time

import triton

SUPPORTED = ("3.6",)


class Deadlock(RuntimeError):
    """Programs still waiting when the run's time was up."""


class _Stopped(RuntimeError):
    pass


def _interpreter():
    from triton.runtime import interpreter
    if not triton.__version__.startswith(SUPPORTED):
        raise RuntimeError(f"tests.kernels.wpk_threads knows Triton {SUPPORTED}'s interpreter, not "
                           f"{triton.__version__}")
    return interpreter


_installed = threading.Lock()
_users = 0                        # threaded runs under way (they may overlap: a relaunch)
_local = threading.local()        # this thread's program index, grid and stop event
_restore: list = []
_patched: set = set()


def _install(interp, fn) -> None:
    """The builder's program index and grid kept per thread, and its atomics stopped when the
    thread's run is (a spinning program then raises instead of spinning on); the language
    patched for `fn` once. Installed by the first of overlapping runs, removed by the last."""
    global _users
    with _installed:
        _users += 1
        if fn not in _patched:
            _patched.add(fn)
            _restore.append(interp._patch_lang(fn).restore)
        if _users > 1:
            return
        cls = interp.InterpreterBuilder
        rmw, cas = cls.create_atomic_rmw, cls.create_atomic_cas

        def per_thread(name):
            return property(lambda self: getattr(_local, name, None),
                            lambda self, value: setattr(_local, name, value))

        def checked(fn):
            def call(self, *args):
                stop = getattr(_local, "stop", None)
                if stop is not None and stop.is_set():
                    raise _Stopped("stopped: the run timed out")
                return fn(self, *args)
            return call

        cls.grid_idx, cls.grid_dim = per_thread("idx"), per_thread("dim")
        cls.create_atomic_rmw, cls.create_atomic_cas = checked(rmw), checked(cas)
        # A device function is rewritten (its source parsed and compiled) on its first call; two
        # programs making that call at once compile at once, which CPython 3.11 does not survive
        # ("AST constructor recursion depth mismatch"): one rewrite at a time.
        interpreted, rewriting = interp.InterpretedFunction, threading.Lock()
        rewrite = interpreted.rewrite

        def one_at_a_time(self):
            with rewriting:
                return rewrite(self)
        interpreted.rewrite = one_at_a_time

        def undo():
            del cls.grid_idx, cls.grid_dim
            cls.create_atomic_rmw, cls.create_atomic_cas = rmw, cas
            interpreted.rewrite = rewrite
        _restore.insert(0, undo)                 # undone last, after the language patches


def _uninstall() -> None:
    global _users
    with _installed:
        _users -= 1
        if _users == 0:
            while _restore:                      # newest first
                _restore.pop()()
            _patched.clear()


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
    _install(interp, ex.fn)
    try:
        call = inspect.getcallargs(ex.fn, *args_hst, **kwargs_hst)
        call = {name: value if name in ex.constexprs else interp._implicit_cvt(value)
                for name, value in call.items()}

        def program(x: int, y: int, z: int) -> None:
            _local.dim, _local.idx, _local.stop = grid, (x, y, z), stop
            try:
                ex.fn(**call)
            except BaseException as exc:          # reported by the caller's thread
                errors.append(exc)

        threads = [threading.Thread(target=program, args=(x, y, z), daemon=True,
                                    name=f"program-{x}.{y}.{z}")
                   for x in range(grid[0]) for y in range(grid[1]) for z in range(grid[2])]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        waiting = [t.name for t in threads if t.is_alive()]
        if waiting:
            stop.set()
            for t in threads:
                t.join(10.0)
            raise Deadlock(f"{len(waiting)} of {len(threads)} programs still running after "
                           f"{timeout_s} s: {', '.join(waiting[:8])}")
    finally:
        _uninstall()
    real = [e for e in errors if not isinstance(e, _Stopped)]
    if real:
        raise real[0]
    ex._restore_args_dev(args, args_hst, kwargs, kwargs_hst)
