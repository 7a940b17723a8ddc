"""What a graph executor's configuration needs on the device, decided before anything is
allocated: the weights, every slot's state (and the trash slot's), the prompt snapshots and the
workspace (activations and the graph pools of every captured bucket); and how many sessions
fit in what is free.
"""
from __future__ import annotations

import math

import torch

from gpu.model.config import Profile, VoiceChatConfig
from gpu.model.voicechat_state import session_state_bytes
from gpu.model.voicechat_weights import load_dtype, param_shapes
from wave_actors.core.sched.start_shape import GRAPH_MAX_PROMPT

# Activations, graph pools, logits, CUDA context. docs/MODEL.md §4 budgets a flat 4 GB, but the beat
# graph's activations grow with the batch (bench/results/graph-*.json record what was used), so:
# a base plus a share per slot, with margin over the measured slope.
WORKSPACE_BASE = 2.5e9
WORKSPACE_PER_SLOT = 25e6
# The beat graphs of every bucket below the top (three row captures each) take ~60 MB a graph
# (dense, measured): a node that sizes itself keeps this back for them, and the ladder stops
# where less than LADDER_KEEP_FREE of the device's memory would stay free outside the graphs'
# pool (smaller beats then pad to the last bucket): a beat's eager work (resets, copies, rolls)
# allocates there, and a graph pool's cached blocks cannot serve it.
LADDER_BYTES = 3e9
LADDER_KEEP_FREE = 1e9
GRAPH_FIXED_BYTES = 0.2e9     # a bucket's three graphs, before their rows' share
# Prompt snapshots' device memory by default: three dense ones (~152 MB each), room for a node's
# few system prompts without taking a slot's worth of memory from the sessions.
SNAPSHOT_BYTES = 0.5e9


class MemoryPlan:
    """What the configuration needs on the device, decided before anything is allocated: the
    weights, every slot's state (and the trash slot's), the prompt snapshots, the workspace
    (activations and graph pools of every captured bucket)."""

    def __init__(self, cfg: VoiceChatConfig, profile: Profile, max_sessions: int,
                 max_context: int, max_prompt: int, snapshot_bytes: float = 0.0):
        dtype_of = load_dtype(cfg, profile)
        self.weights = sum(math.prod(s) * dtype_of(n).itemsize for n, s in param_shapes(cfg).items())
        self.per_session = session_state_bytes(cfg, profile, max_context, max_prompt)["total"]
        self.snapshots = snapshot_bytes
        self.sessions = max_sessions + 1                     # + the trash slot
        self.state = self.per_session * self.sessions
        self.workspace = WORKSPACE_BASE + WORKSPACE_PER_SLOT * self.sessions
        self.total = self.weights + self.state + self.snapshots + self.workspace

    def ceiling(self, free: float) -> int:
        per_slot = self.per_session + WORKSPACE_PER_SLOT
        return max(0, int((free - self.weights - self.snapshots - WORKSPACE_BASE)
                          // per_slot) - 1)

    def check(self, free: float) -> None:
        if self.total > free:
            raise MemoryError(
                f"{self.sessions - 1} sessions at this context need {self.total / 1e9:.1f} GB "
                f"(weights {self.weights / 1e9:.1f} + state {self.per_session / 1e6:.1f} MB × "
                f"{self.sessions} + snapshots {self.snapshots / 1e9:.1f} + workspace "
                f"{self.workspace / 1e9:.1f}); the device has {free / 1e9:.1f} GB free: at most "
                f"{self.ceiling(free)} sessions fit")


def planned_memory(free: float, total: float, share: float = 1.0, used: float = 0.0) -> float:
    """Device memory a node may still plan with: what is free now, and no more than its
    `share` of the device less what it `used` already, when nodes share one (each holds its
    own weights and state: the first of them to build would otherwise plan with the whole
    device and leave the next none)."""
    return min(free, share * total - used)


def device_free(share: float = 1.0) -> float:
    """`planned_memory` on this process's device now (what torch's allocator holds counts as
    used; the CUDA context does not, a fraction of a GB)."""
    free, total = torch.cuda.mem_get_info()
    return planned_memory(free, total, share, torch.cuda.memory_reserved())


def memory_ceiling(config: str, profile: str, max_context: int,
                   max_prompt: int = GRAPH_MAX_PROMPT) -> int:
    """Sessions that fit in the device's free memory now at `max_context` frames."""
    plan = MemoryPlan(VoiceChatConfig.named(config), Profile.named(profile), 1, max_context,
                      max_prompt)
    return plan.ceiling(device_free())
