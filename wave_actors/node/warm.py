"""Prompts a node prefills before it serves, so their first callers start from a snapshot.

A session whose prompt the executor has a snapshot of starts by one device copy in the beat it
opens in; the first session with a prompt instead prefills it in start rows over one or more
beats, and when many dial at once every one of them waits for that prefill. An operator's calls
mostly share a few prompts (the bridge's `--instructions`, the agent's system prompt), so the
node starts each of its `warm_prompts` before it reads its socket: it admits a session with
that prompt through the clock like any other, waits for its start to be planned in (the
snapshot is saved behind that beat's rows), and releases it before it runs a frame. Nothing is
heard, routed or counted as a call; the snapshot index counts the miss and the save.

A restarted clock starts with an empty snapshot index, so the node warms its prompts again
then, beside whatever callers open meanwhile. An executor that keeps no snapshots gains nothing
from this, so the node skips it there.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from wave_actors.clock.clock import Admit, Release
from wave_actors.core.contract import SessionSpec
from wave_actors.core.prompt import PromptRejected
from wave_actors.core.sched.jitter import CapacityError

log = logging.getLogger("wave.node")


class WarmFailed(ValueError):
    """A warm prompt the node cannot take (too long for its prompt positions, or refused a
    slot): the node does not start, and the message says which prompt and why."""


@dataclass
class WarmReport:
    asked: int = 0
    ready: int = 0                 # started (their snapshots saved behind their last rows)
    timed_out: int = 0             # not started in time: their first caller prefills as usual
    seconds: float = 0.0           # on the node's clock


def describe_spec(spec: SessionSpec) -> str:
    text = spec.instructions if len(spec.instructions) <= 40 else spec.instructions[:37] + "..."
    tools = f" + {len(spec.tools)} tools" if spec.tools else ""
    return f"{text!r}{tools}"


async def warm_at_start(node) -> None:
    """The node's prompts warmed before it reads its socket (`node.warmed`, the report); a
    prompt it cannot take stops its start (WarmFailed), with nothing left bound or running."""
    try:
        node.warmed = await warm_node(node.clock_actor, node.executor, node.cfg, node.clock.now)
    except Exception:
        await node.drain()
        raise
    node.metrics.snapshots(node.clock_actor.snapshot_stats)


async def warm_again(node) -> None:
    """After a clock restart (the snapshots went with the last incarnation), beside the
    callers who open meanwhile: a prompt it cannot take now (every slot held, say) is logged,
    and its first caller prefills it."""
    try:
        node.warmed = await warm_node(node.clock_actor, node.executor, node.cfg, node.clock.now)
    except Exception as exc:
        log.warning("warming the prompts again after a clock restart failed: %r", exc)


async def warm_node(clock, executor, cfg, now) -> WarmReport | None:
    """`cfg.warm_prompts` warmed on the node's `clock` actor (None: none asked, or the executor
    keeps no snapshots), with the operator told what and how long (`now`: the node's time)."""
    specs = list(cfg.warm_prompts)
    space = getattr(executor, "snapshot_space", None)      # as the clock's book reads it
    entries = 0 if space is None else space.entries
    if not specs or not entries:
        return None
    if len(specs) > entries:
        log.warning("%d warm prompts, room for %d snapshots: the first %d warmed are dropped "
                    "again (more --snapshot-mb keeps them)", len(specs), entries,
                    len(specs) - entries)
    log.info("warming %d prompt(s): %s", len(specs), ", ".join(map(describe_spec, specs)))
    began = now()
    report = await warm(clock, specs, executor.max_sessions, cfg.warm_timeout_s)
    report.seconds = now() - began
    log.info("warmed %d of %d prompt(s) in %.2f s", report.ready, len(specs), report.seconds)
    return report


async def warm(clock, specs: list[SessionSpec], slots: int, timeout_s: float) -> WarmReport:
    """Start every one of `specs` on `clock` (the node's clock actor or its proxy), at most
    `slots` at a time, and release each once its start is planned in. Raises WarmFailed for a
    prompt the node refuses; a start that does not come within `timeout_s` is logged and
    released (the node serves on: its first caller prefills that prompt)."""
    report = WarmReport(asked=len(specs))
    for first in range(0, len(specs), max(1, slots)):
        await _warm_batch(clock, specs[first:first + max(1, slots)], first, timeout_s, report)
    return report


async def _warm_batch(clock, specs: list[SessionSpec], first: int, timeout_s: float,
                      report: WarmReport) -> None:
    """Admit every prompt of the batch, then release each the moment its start is planned in
    (a prompt whose start is planned goes live in the next beat: it must be gone by then)."""
    handles = []
    try:
        for i, spec in enumerate(specs, first):
            try:
                handles.append(await clock.ask(Admit(("warm", i), None, spec)))
            except PromptRejected as exc:
                raise WarmFailed(f"warm prompt {i + 1} ({describe_spec(spec)}): {exc}") from None
            except CapacityError as exc:
                raise WarmFailed(f"warm prompt {i + 1}: no slot to start it in ({exc})") from None
    except BaseException:
        for handle in handles:
            await clock.ask(Release(handle))
        raise
    done = await asyncio.gather(*(_start_and_release(clock, h, timeout_s) for h in handles))
    report.ready += sum(done)
    report.timed_out += len(done) - sum(done)
    for i, ok in enumerate(done, first):
        if not ok:
            log.warning("warm prompt %d (%s) did not start within %.0f s: its first caller "
                        "prefills it", i + 1, describe_spec(specs[i - first]), timeout_s)


async def _start_and_release(clock, handle, timeout_s: float) -> bool:
    try:
        ready = await asyncio.wait_for(asyncio.shield(clock.when_ready(handle)), timeout_s)
    except asyncio.TimeoutError:
        ready = False
    await clock.ask(Release(handle))
    return bool(ready)
