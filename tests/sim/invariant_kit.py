"""What the invariant tests of the node on virtual time share (`test_invariants.py`,
`test_invariants_starts.py`): hypothesis settings, and an executor that runs scripted beat
times with no model."""
from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings

from sim.costmodel import CostModel
from sim.executor import snapshot_space
from tests.nodekit import VirtualNode
from transports.client import Refused
from wave_actors.core.contract import NO_TOKEN, BeatInput, BeatOutput, SessionSpec
from wave_actors.core.frames import BEAT_S
from wave_actors.core.prompt import fitted_prompt_tokens
from wave_actors.core.registry import REGISTRY
from wave_actors.core.sched.start_shape import StartShape
from wave_actors.core.text import PAD, ByteFallbackCodec, UserByteFallbackCodec

NODE = settings(max_examples=12, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
EPS = 1e-6                  # virtual time: message hops take no time, float sums a little


def tmp_dir() -> Path:
    return Path(tempfile.mkdtemp())


def instructions(chars: int) -> str:
    return "x" * chars


class ScriptedExecutor:
    """The Executor protocol with no model: each beat takes the next time of `times` (a list,
    or a function of the beat's index), slept on the node's clock; the engine's start shape,
    prompt fitting (`StartShape()`, the byte codec) and prompt snapshots (a GPU executor's
    space, as `test_snapshots.py` checks the sim's is). Records every plan it ran."""
    name = "scripted"
    caps = REGISTRY["cpu"].caps         # a host executor's: no modelled time, no frame reads
    start_shape = StartShape()
    on_launched = None

    def __init__(self, options, clock, times):
        self.options, self.clock, self.times = options, clock, times
        self.max_sessions = options.max_sessions
        self.snapshot_space = snapshot_space(options, CostModel.load(), self.start_shape)
        self.text_codec, self.user_codec = ByteFallbackCodec(), UserByteFallbackCodec()
        self.plans: list = []
        self._end = None

    def alloc_input(self) -> BeatInput:
        return BeatInput.alloc(self.max_sessions)

    def alloc_output(self, into=None) -> BeatOutput:
        return into if into is not None else BeatOutput.alloc(self.max_sessions)

    def prompt_tokens(self, spec: SessionSpec) -> list[int]:
        return fitted_prompt_tokens(self.text_codec, spec.instructions, spec.tools,
                                    self.start_shape.max_prompt)

    def _time(self, i: int) -> float:
        if callable(self.times):
            return self.times(i)
        return self.times[i] if i < len(self.times) else BEAT_S / 2

    def submit(self, plan, inp, out) -> None:
        took = self._time(len(self.plans))
        self.plans.append(plan)
        self._end = (self.clock.now() + took, took)

    async def wait(self) -> None:
        if self._end is not None:
            await self.clock.sleep_until(self._end[0])

    async def wait_first(self) -> None:
        await self.wait()

    def collect(self, plan, out) -> float:
        (_, took), self._end = self._end, None
        out.text[plan.live], out.func[plan.live], out.user[plan.live] = PAD, PAD, NO_TOKEN
        return took

    def reset(self) -> None:
        pass

    def describe(self) -> dict:
        return {"backend": self.name, "max_sessions": self.max_sessions}

    def close(self) -> None:
        pass


def scripted(times):
    """A VirtualNode executor factory for `ScriptedExecutor(times)`."""
    return lambda options, _cost, clock, trace=False: ScriptedExecutor(options, clock, times)


async def open_one(vn: VirtualNode, name: str, chars: int = 0):
    """(time answered, session or the Refused)."""
    try:
        cs = await vn.client.open(name, instructions=instructions(chars), timeout=120.0)
    except Refused as exc:
        return vn.clock.now(), exc
    return vn.clock.now(), cs
