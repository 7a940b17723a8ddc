"""Policies named on a command line: `module:Class key=value ...` (or a built-in's short name).

    --policy budgeted margin_s=0.004 max_hold=6
    --policy wave_actors.core.sched.start_policy:EagerStarts
    --policy mylab.policies:Fifo steps=2

Values are read as JSON where they parse (numbers, true/false, null, quoted strings) and as
plain strings otherwise; the class is called with them as keyword arguments, so an unknown key
or a bad value is an error that names the policy, not a silent default.
"""
from __future__ import annotations

import importlib
import json

BUILT_IN = {"budgeted": "wave_actors.core.sched.start_policy:BudgetedStarts",
            "eager": "wave_actors.core.sched.start_policy:EagerStarts",
            "guarded": "wave_actors.core.sched.start_policy:GuardedStarts",
            "headroom": "wave_actors.core.sched.admission_policies:HeadroomAdmission",
            "forecast": "wave_actors.core.sched.admission_policies:ForecastAdmission"}

# Modules that moved: runs recorded before the move name their policies here.
MOVED = {f"wave_actors.core.{m}": f"wave_actors.core.sched.{m}"
         for m in ("start_policy", "clock_policy")}
# Classes that moved between modules, by their module's newest name.
MOVED_CLASSES = {f"wave_actors.core.sched.start_policy:{c}":
                 f"wave_actors.core.sched.admission_policies:{c}"
                 for c in ("HeadroomAdmission", "ForecastAdmission")}


class PolicyError(ValueError):
    pass


def load_class(target: str) -> type:
    """`module:Class` → the class, imported now."""
    module, _, name = target.partition(":")
    module, _, name = MOVED_CLASSES.get(f"{MOVED.get(module, module)}:{name}",
                                        f"{MOVED.get(module, module)}:{name}").partition(":")
    if not module or not name:
        raise PolicyError(f"{target!r}: name a policy as module:Class (or one of {sorted(BUILT_IN)})")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise PolicyError(f"{target!r}: {exc}") from None


def parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def make_policy(words: list[str]):
    """['module:Class' or short name, 'key=value', ...] → the policy object."""
    if not words:
        raise PolicyError("--policy needs a policy: module:Class or one of " + str(sorted(BUILT_IN)))
    target, *pairs = words
    cls = load_class(BUILT_IN.get(target, target))
    kwargs = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.isidentifier():
            raise PolicyError(f"{pair!r}: policy parameters are key=value")
        kwargs[key] = parse_value(value)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"{target}: {exc}") from None
