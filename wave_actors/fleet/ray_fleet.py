"""The fleet on Ray: Ray holds the control plane only. One named directory actor
(`directory_actor.py`) owns the `Directory`; one node actor a GPU (`node_actor.py`: a GPU, or a
share of one) runs today's node as a child process with its own ZeroMQ endpoint, so audio never
passes through Ray. Ray restarts a node actor that dies (`max_restarts`); the restarted actor
starts a fresh node and joins the directory again under its name, which forgets the sessions of
the dead incarnation (their state was on its GPU).

`Fleet` is the driver's handle (the entry point): it starts the directory and the nodes, or
attaches to those a previous entry point started (`detached` actors outlive their driver, so an
entry point that dies and starts again loses no call: the calls' state is in the directory and
on the nodes). It watches the nodes: one whose actor or process died is reported lost at once,
so its calls end and its slots leave placement within a watch period; one that is only slow to
answer leaves placement but keeps its calls, and is declared lost and restarted if it stays
silent `SILENT_LOSS_S`. Each answer carries the node's metrics, and its beat headroom goes to
the directory. It drains nodes: out of placement, wait until its calls have ended, then stop.
A drain asked of the directory by another process (`python -m wave_actors.fleet drain NODE`)
is finished by the watch.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import ray

from transports.fleet_client import DIRECTORY, NAMESPACE
from wave_actors.fleet.directory_actor import DirectoryActor
from wave_actors.fleet.metrics import NodeReading, Totals
from wave_actors.fleet.node_actor import START_TIMEOUT_S, NodeActor

WATCH_S = 0.5               # how often the driver checks that each node answers
# Read by Ray's processes when they start (the driver's at `ray.init`, and a local cluster's
# that it starts), so set on import. A call in flight on an actor that dies fails once the
# GCS says why it died, or after this wait (Ray's default 1 s): the watch hears a node's death
# by such a call (`exited`) and needs the failure at once, not its cause. And a killed actor's
# worker is given this long to exit before it is killed outright (Ray's default 1 s): a node
# the watch fences must stop serving at once. On a cluster started by `ray start`, set both in
# that command's environment.
os.environ.setdefault("RAY_timeout_ms_task_wait_for_death_info", "100")
os.environ.setdefault("RAY_kill_worker_timeout_milliseconds", "100")
# A node whose process runs but that has not answered a reading in this long is declared lost
# and restarted. Shorter silences (a loaded host, a long collection) only keep new calls away.
SILENT_LOSS_S = 10.0


@dataclass
class _Watched:
    """What the watch knows of the nodes between periods."""
    down: set[str] = field(default_factory=set)             # lost, until a reading comes
    draining: set[str] = field(default_factory=set)         # as the directory last said
    acked: dict[str, tuple[int, int]] = field(default_factory=dict)   # last `events_mark`
    pending: dict[str, "ray.ObjectRef"] = field(default_factory=dict)  # readings asked
    silent_since: dict[str, float] = field(default_factory=dict)      # unanswered since
    # `exited` asked of each node, and of which incarnation
    exits: dict[str, tuple["ray.ObjectRef", int]] = field(default_factory=dict)


def shared_node_args(node_args: list[str], per_gpu: int) -> list[str]:
    """A node's command line where `per_gpu` nodes share a GPU: its `--gpu-share` is 1/per_gpu,
    unless the operator gave one."""
    if per_gpu == 1 or any(a.split("=")[0] == "--gpu-share" for a in node_args):
        return list(node_args)
    return [*node_args, "--gpu-share", f"1/{per_gpu}"]


class Fleet:
    """Use `Fleet.start` (new actors) or `Fleet.attach` (a running fleet's)."""

    silent_loss_s = SILENT_LOSS_S

    def __init__(self, directory, nodes: dict, namespace: str = NAMESPACE):
        self.directory, self.nodes, self.namespace = directory, nodes, namespace
        self.names = list(nodes)
        self.lost_events: list[tuple[str, float]] = []
        self.readings: dict[str, NodeReading] = {}
        self.totals = Totals()
        self.last_stats: dict = {}
        self._lock = threading.Lock()
        self._retiring: dict[str, threading.Event] = {}     # node → set once it is retired
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    @classmethod
    def start(cls, nodes: int, node_args: list[str], placement: str = "most_free",
              base_port: int | None = None, seed: int = 0, namespace: str = NAMESPACE,
              detached: bool = False, per_gpu: int = 1,
              start_timeout_s: float = START_TIMEOUT_S) -> "Fleet":
        """`base_port`: node i binds base_port + i; None: each a free port (the directory
        hands out the endpoints). `detached`: the actors outlive this driver (on a Ray cluster
        that does too), so a restarted entry point can attach to them. `per_gpu`: nodes
        sharing each GPU (each is given 1/per_gpu of one, in Ray's accounting and as its
        `--gpu-share`, within which it sizes its slots, or checks its `--max-sessions`)."""
        if per_gpu < 1:
            raise ValueError(f"per_gpu is a count of nodes a GPU holds (>= 1), not {per_gpu}")
        node_args = shared_node_args(node_args, per_gpu)
        life = {"lifetime": "detached"} if detached else {}
        directory = DirectoryActor.options(name=DIRECTORY, namespace=namespace,
                                           **life).remote(placement, seed)
        names = [f"node{i}" for i in range(nodes)]
        actors = {}
        for i, name in enumerate(names):
            actors[name] = NodeActor.options(name=f"wave-{name}", namespace=namespace,
                                             num_gpus=1 / per_gpu, **life).remote(
                name, "*" if base_port is None else base_port + i, node_args, namespace,
                start_timeout_s)
            if per_gpu > 1:
                # Nodes sharing a GPU start one at a time: a model's build holds more memory
                # than it keeps, and two builds side by side ran out where the two nodes fit.
                ray.get(actors[name].info.remote())
        return cls(directory, actors, namespace)

    @classmethod
    def attach(cls, namespace: str = NAMESPACE) -> "Fleet | None":
        """The fleet already running in `namespace` (None if there is none)."""
        try:
            directory = ray.get_actor(DIRECTORY, namespace=namespace)
        except ValueError:
            return None
        names = sorted(ray.get(directory.stats.remote())["nodes"])
        return cls(directory, {n: ray.get_actor(f"wave-{n}", namespace=namespace)
                               for n in names}, namespace)

    def ready(self) -> list[dict]:
        """Every node's facts, once each listens (raises if one could not start)."""
        return ray.get([a.info.remote() for a in self.nodes.values()])

    def watch(self) -> None:
        """Hear at once of a node whose actor or process died (its slots leave placement; Ray
        restarts it and it joins again); every WATCH_S read each node (one that does not
        answer is lost), report its headroom, and finish the drains asked of the directory."""
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        w = _Watched()
        # each node's incarnation from the start (acknowledging none of its session lines):
        # a loss heard before its first reading names the incarnation that died, and a
        # restart that joined meanwhile is not taken for it
        for name, (incarnation, _) in ray.get(self.directory.health.remote())["nodes"].items():
            if name in self.nodes:
                w.acked[name] = (incarnation, 0)
        due = time.monotonic() + WATCH_S
        while not self._stop.is_set():
            self._hear_exits(w, max(0.0, due - time.monotonic()))
            if time.monotonic() >= due and not self._stop.is_set():
                self._period(w)
                due = time.monotonic() + WATCH_S

    def _hear_exits(self, w: "_Watched", timeout_s: float) -> None:
        """Up to `timeout_s` waiting on each serving node's `exited`: a node whose actor died
        (the call fails) or whose process exited (it returns) is lost the moment Ray says so."""
        for name, actor in list(self.nodes.items()):
            # asked of the incarnation last read: a restart that joins before this one's
            # death is heard must not be the one reported lost
            if name not in w.exits and name not in w.down and name in w.acked:
                w.exits[name] = (actor.exited.remote(), w.acked[name][0])
        if not w.exits:
            self._stop.wait(timeout_s)
            return
        ready, _ = ray.wait([ref for ref, _ in w.exits.values()], num_returns=1,
                            timeout=timeout_s)
        for ref in ready:
            name = next(n for n, (r, _) in w.exits.items() if r == ref)
            incarnation = w.exits.pop(name)[1]
            try:
                ray.get(ref)
            except ray.exceptions.RayError:     # its actor died: Ray restarts it
                self._lost(name, w, fence=False, incarnation=incarnation)
            else:                               # its node exited, the actor lives
                self._lost(name, w, fence=True, incarnation=incarnation)

    def _period(self, w: "_Watched") -> None:
        """Each node read, its headroom and session lines told to the directory, drains
        finished."""
        headrooms, events = self._read_nodes(w)
        # one message a period, not one a node: the directory's load
        self.directory.report.remote(headrooms, events)
        self.last_stats = ray.get(self.directory.stats.remote())
        if self.last_stats.get("restoring"):
            self._restore(w)
        else:
            w.draining = {n for n, v in self.last_stats["nodes"].items() if v["draining"]}
        for name, n in self.last_stats["nodes"].items():
            if n["draining"] and n["used"] == 0 and name in self.nodes:
                # off the watch's thread: a node's stop takes seconds, the others' watch
                # goes on meanwhile
                threading.Thread(target=self._retire, args=(name,), daemon=True).start()

    def _restore(self, w: "_Watched") -> None:
        """The directory restarted and lost its state: each node says again what it holds,
        and the drains it had been asked are asked again. One node that cannot (lost
        meanwhile) is asked again next period, until the directory's wait runs out."""
        asked = [actor.rejoin.remote() for actor in list(self.nodes.values())]
        try:
            ray.get(asked, timeout=10 * WATCH_S)
        except (ray.exceptions.RayError, RuntimeError):
            return
        for name in w.draining & set(self.nodes):
            try:
                ray.get(self.directory.drain.remote(name))
            except ray.exceptions.RayError:         # retired meanwhile: nothing to drain
                pass
        ray.get(self.directory.restored.remote())

    def _read_nodes(self, w: "_Watched") -> tuple[dict, dict]:
        """Every node read at once, each given what is left of one watch period. A reading
        still unanswered is waited for again, not asked a second time (a stuck node would
        pile them up)."""
        for name, actor in list(self.nodes.items()):
            if name not in w.pending:
                w.pending[name] = actor.load.remote(w.acked.get(name, (-1, 0)))
        deadline = time.monotonic() + WATCH_S
        headrooms: dict[str, float] = {}
        events: dict[str, tuple[int, list[tuple[str, str]]]] = {}
        for name, ref in list(w.pending.items()):
            if name not in self.nodes:                      # retired meanwhile
                del w.pending[name]
                continue
            try:
                reading = ray.get(ref, timeout=max(0.05, deadline - time.monotonic()))
            except ray.exceptions.GetTimeoutError:
                self._silent(name, w)
                continue
            except (ray.exceptions.RayError, RuntimeError, OSError) as exc:
                del w.pending[name]
                # the actor answered that its node process is gone: it must be restarted;
                # an actor that died is restarted by Ray already
                self._lost(name, w, fence=isinstance(exc, ray.exceptions.RayTaskError))
                continue
            del w.pending[name]
            if reading is None:
                self._silent(name, w)
                continue
            w.down.discard(name)
            was_quiet = self.last_stats.get("nodes", {}).get(name, {}).get("quiet")
            if w.silent_since.pop(name, None) is not None or was_quiet:
                self.directory.quiet.remote(name, False)
            if reading.events:
                events[name] = (reading.events_mark[0], reading.events)
            w.acked[name] = reading.events_mark
            headroom = reading.headroom_ms(self.readings.get(name))
            if headroom is not None:
                headrooms[name] = headroom
            self.totals.add(name, reading)
            self.readings[name] = reading
        return headrooms, events

    def _silent(self, name: str, w: "_Watched") -> None:
        """No reading from a node this period. Slow is not dead: it leaves placement but keeps
        its calls, until it has been silent `silent_loss_s`."""
        if name in w.down:
            return                          # lost already: its restart is under way
        now = time.monotonic()
        if name not in w.silent_since:
            w.silent_since[name] = now
            # the incarnation last heard from: a node restarted meanwhile is not made quiet
            self.directory.quiet.remote(name, True, w.acked.get(name, (None,))[0])
        elif now - w.silent_since[name] > self.silent_loss_s:
            w.pending.pop(name, None)
            self._lost(name, w, fence=True)

    def _lost(self, name: str, w: "_Watched", fence: bool,
              incarnation: int | None = None) -> None:
        """`name`'s calls end at their callers and its slots leave placement. `fence`: its
        actor lives but the node does not serve (its process exited, or it is stuck), so the
        actor is killed for Ray to restart: no process goes on with calls the directory has
        forgotten, and a fresh incarnation joins."""
        w.silent_since.pop(name, None)
        w.exits.pop(name, None)         # asked of the lost incarnation: never waited on again
        if name in w.down or name not in self.nodes:
            return
        w.down.add(name)
        # the incarnation last heard from: where the restarted node joined before this
        # failure was seen, the directory leaves it be (its join already forgot the lost
        # one's calls)
        if incarnation is None:
            incarnation = w.acked.get(name, (None,))[0]
        ray.get(self.directory.lost.remote(name, incarnation))
        self.lost_events.append((name, time.time()))
        if fence:
            ray.kill(self.nodes[name], no_restart=False)

    def drain(self, name: str, timeout_s: float = 600.0) -> int:
        """Out of placement, wait for its calls to end (closes told to the directory), stop.
        Returns the calls still live at the timeout (0: a clean drain)."""
        ray.get(self.directory.drain.remote(name))
        deadline = time.monotonic() + timeout_s
        while (live := ray.get(self.directory.live_on.remote(name))) and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        self._retire(name)
        return live

    def _retire(self, name: str) -> None:
        """Stop a node and take it out of the directory (a drain's last step). The watch and
        a drain may both reach here: one retires it, the other waits until that is done."""
        with self._lock:
            done = self._retiring.get(name)
            if done is None:
                done = self._retiring[name] = threading.Event()
                actor = self.nodes.pop(name, None)   # out of the watch: its stop is no loss
            else:
                actor = None
        if actor is None:
            done.wait()
            return
        try:
            self.readings.pop(name, None)
            ray.get(actor.stop.remote())
            ray.get(self.directory.leave.remote(name))
            ray.kill(actor, no_restart=True)
        finally:
            done.set()

    def stop_watch(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()

    def close(self) -> None:
        self.stop_watch()
        for actor in self.nodes.values():
            try:
                ray.get(actor.stop.remote(), timeout=15)
            except ray.exceptions.RayError:
                pass
            ray.kill(actor, no_restart=True)
        ray.kill(self.directory)
