"""The executor registry: name → where its class lives and what it can do (plain data).

Entries name their class as `module:Class`, imported only when built (`make_executor`), so the node and the simulator run on machines without
torch and no package imports an executor's package back. Tools ask an entry's capabilities
(`device`, `modelled_time`, ...), never its name; an executor class reads its own `caps` here.
"""
from __future__ import annotations

from dataclasses import dataclass

from wave_actors.core.contract import Capabilities, Executor, ExecutorOptions
from wave_actors.core.policy_spec import load_class
from wave_actors.core.timebase import Clock


# The precision profiles a node serves (`gpu/model/config.py`'s PROFILES, less the tests'
# fp32 ones), named here so the CLIs offer them without importing torch.
SERVING_PROFILES = ("reference", "dense", "dense-ssm16", "dense-ssm16-sr", "dense-compact")


@dataclass(frozen=True, kw_only=True)
class ExecutorEntry:
    name: str
    target: str                 # module:Class, with a `build(options, clock)` classmethod
    caps: Capabilities
    summary: str


REGISTRY: dict[str, ExecutorEntry] = {e.name: e for e in (
    ExecutorEntry(name="sim", target="sim.executor:SimExecutor",
                  caps=Capabilities(modelled_time=True, reads_frames=True, first_frame=True),
                  summary="no model: synthetic outputs, time from a cost model (virtual time)"),
    ExecutorEntry(name="cpu", target="gpu.engine.cpu_executor:CpuExecutor",
                  caps=Capabilities(first_frame=True),
                  summary="the reference PyTorch model on the CPU (tiny config by default)"),
    ExecutorEntry(name="graph", target="gpu.engine.graph_executor:GraphExecutor",
                  caps=Capabilities(device=True, reports_launch=True, first_frame=True),
                  summary="the full model on one GPU: CUDA graphs and Triton kernels"),
    ExecutorEntry(name="wpk", target="gpu.engine.wpk_executor:WpkExecutor",
                  caps=Capabilities(device=True, reports_launch=True, reads_frames=True,
                                    first_frame=True),
                  summary="graph's beats started by a doorbell a resident controller answers on "
                          "the GPU, frames read on the GPU from the clients' ring"),
)}
NAMES = tuple(REGISTRY)


def entry(name: str) -> ExecutorEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown executor {name!r}; choose one of {NAMES}") from None


def make_executor(name: str, opts: ExecutorOptions, clock: Clock | None = None) -> Executor:
    return load_class(entry(name).target).build(opts, clock)


def described() -> str:
    """One line per executor, for a command's help."""
    return "; ".join(f"{e.name}: {e.summary}" for e in REGISTRY.values())
