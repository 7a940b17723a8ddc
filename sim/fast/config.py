"""The fast mode's configuration (`sim.fast.fast`): what one run serves, on what node, under which
policy, and its checks."""
from __future__ import annotations

from dataclasses import dataclass, field

from wave_actors.bench.workload import Workload
from wave_actors.bench.results import WARMUP_MAX
from wave_actors.core.contract import ExecutorOptions
from wave_actors.core.sched.clock_policy import ClockPolicy


class FastError(ValueError):
    pass


@dataclass(frozen=True)
class FastConfig:
    slots: int                          # the node's max sessions
    workload: Workload | None = None    # calls to serve; None: closed loop of `lines`
    lines: int = 0                      # closed loop: caller lines (`drive_line`)
    churn_s: float = 0.0                # closed loop: mean call length (0: calls never end)
    beats: int = 0                      # closed loop: beats measured; workload: a cap (0: none)
    profile: str = "reference"
    context: int = 1500
    cost_model: str | None = None       # JSON path (None: the roofline defaults)
    policy: object = None               # a start-policy object (None: GuardedStarts, the
                                        # node's); each run gets a fresh copy, as each bench
                                        # run a fresh node
    seed: int = 0
    runs: int = 1                       # run r draws from seed + r
    command: str = ""
    # a generator's spec: run r serves the workload it draws from seed + r (as the bench's
    # runs do); None: every run serves `workload` as given
    workload_spec: str | None = None
    clock: ClockPolicy = field(default_factory=ClockPolicy)     # prebuffer, queue, shedding
    warmup_max: int = WARMUP_MAX
    snapshot_mb: float = -1.0           # prompt snapshots' memory (-1: the executors', 0: none)
    # the node's warm-up (`NodeConfig.warm_prompts`): the empty prompt's snapshot is made
    # before the first caller dials (False: as a node that warms nothing)
    warm: bool = True

    def __post_init__(self) -> None:
        if self.slots < 1 or self.runs < 1 or self.beats < 0:
            raise FastError("slots and runs must be >= 1 and beats >= 0")
        if self.workload is None and (self.lines < 1 or self.beats < 1):
            raise FastError("a closed loop needs lines >= 1 and beats >= 1 (or give a workload)")
        if not self.churn_s >= 0:
            raise FastError("churn_s must be >= 0")
        if not (self.snapshot_mb >= 0 or self.snapshot_mb == -1):
            raise FastError(f"snapshot_mb {self.snapshot_mb}: -1 (the default), 0 (none) or more")

    @property
    def options(self) -> ExecutorOptions:
        """The executor's options as the bench sizes them (`bench.held_context`): sessions hold
        the context less two rolls and roll on past it."""
        roll = ExecutorOptions(max_context=self.context).roll_frames
        return ExecutorOptions(max_sessions=self.slots, profile=self.profile,
                               max_context=self.context, cost_model=self.cost_model,
                               context_offset=max(0, self.context - 2 * roll),
                               context_roll=roll, seed=self.seed, snapshot_mb=self.snapshot_mb)
