"""Builds an executor by its registry name (`wave_actors.core.registry`)."""
from __future__ import annotations

from wave_actors.core.contract import Executor, ExecutorOptions
from wave_actors.core.policy_spec import load_class
from wave_actors.core.registry import NAMES, REGISTRY, entry
from wave_actors.core.timebase import Clock

__all__ = ["NAMES", "REGISTRY", "entry", "make_executor"]


def make_executor(name: str, opts: ExecutorOptions, clock: Clock | None = None) -> Executor:
    return load_class(entry(name).target).build(opts, clock)
