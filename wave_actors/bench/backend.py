"""The executor a bench runs on: built once from the bench's flags, with the context its
sessions hold and the sessions the device's memory holds at it."""
from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing as mp

from wave_actors.core.contract import ExecutorOptions
from wave_actors.core.policy_spec import load_class
from wave_actors.core.registry import entry, make_executor
from wave_actors.core.timebase import Clock
from wave_actors.engine.host import EngineHost
from wave_actors.engine.process import ExecutorSpec


def held_context(args) -> tuple[int, int, int]:
    """(context_offset, max_context, roll): sessions go live holding `--context - 2 * roll`
    frames (random rows on the GPU, modelled in the simulator) and run on past `--context` by
    rolling `roll` frames at a time, the roll a node started with `--max-context` = `--context`
    uses. Over the measured beats each session rolls in turn (a few a beat, see the slot book),
    so the beats run at the rolled steady state of a node serving calls of any length: contexts
    spread over the last two rolls below `--context`, cache rows moved by the rolls included."""
    roll = ExecutorOptions(max_context=args.context).roll_frames
    return max(0, args.context - 2 * roll), args.context, roll


def memory_ceiling(args, max_context: int) -> int:
    """Sessions the device's free memory holds at this context. With --workers it is asked in
    a process of its own: this one never opens the device, which the engine process alone
    uses (a context here would take memory the engine's slots need)."""
    ask = functools.partial(load_class(entry(args.backend).target).memory_ceiling, args.config,
                            args.profile, max_context)
    if not args.workers:
        return ask()
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(ask).result()


def executor_options(args, max_n: int) -> ExecutorOptions:
    """The executor's options from the bench's flags, slots sized for `max_n` sessions."""
    offset, max_context, roll = held_context(args)
    slots = 0 if args.self_size else max(max_n, args.max_sessions or 0)
    return ExecutorOptions(max_sessions=slots, profile=args.profile,
                           config=args.config, max_context=max_context, context_offset=offset,
                           cost_model=args.cost_model, seed=args.seed, context_roll=roll,
                           beat_wait=args.beat_wait, start_rows=args.start_rows,
                           first_poll_ms=args.first_poll_ms, snapshot_mb=args.snapshot_mb)


def make_executor_for(args, max_n: int, clock: Clock | None = None):
    """One backend for the whole benchmark: a GPU model is built once and serves every run (each
    run is a fresh node whose sessions reset their slots). Slots are sized for `max_n` sessions."""
    opts = executor_options(args, max_n)
    if args.workers:      # built in the engine process, which serves every run's node
        return EngineHost(ExecutorSpec(args.backend, opts)).start()
    return make_executor(args.backend, opts, clock)
