"""The directory's Ray actor: the one owner of the fleet's `Directory`, named so that every
entry point and bridge finds it. Its calls run one at a time, so a placement and a close never
interleave.

Ray restarts it when its process dies, and calls made meanwhile are run by the new one. The
new one starts empty and *restoring*: the entry point's watch has each node say again what it
holds (`restore`). Until then, or for RESTORE_S at most, a node the directory does not know yet
is not taken for lost, so a restart ends no call.
"""
from __future__ import annotations

import time

import ray

from wave_actors.fleet.directory import Directory, FleetFull

# A placement its node has not said it opened in this long is given back: its bridge died
# before the open arrived. Far past an open's own wait (10 s), a busy node's included.
OPEN_GRACE_S = 60.0
# A restarted directory waits this long for the nodes to restore it (the watch asks them within
# a period); a node still unknown after it is taken for gone.
RESTORE_S = 15.0


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class DirectoryActor:

    def __init__(self, placement: str = "most_free", seed: int = 0):
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        # restarted: incarnations from the clock's seconds, past any the lost one gave (one a
        # node restart, and restarts take seconds)
        self.d = Directory(placement, seed, first=int(time.time()) if restarted else 0)
        self.restoring_until = time.monotonic() + RESTORE_S if restarted else 0.0
        self.restarted = restarted

    def restoring(self) -> bool:
        return time.monotonic() < self.restoring_until

    def restore(self, name: str, endpoint: str, slots: int, incarnation: int,
                sessions: list[str]) -> bool:
        return self.d.restore(name, endpoint, slots, incarnation, sessions)

    def restored(self) -> None:
        """Every node has said what it holds: placement goes on as before."""
        self.restoring_until = 0.0

    def join(self, name: str, endpoint: str, slots: int) -> int:
        return self.d.join(name, endpoint, slots)

    def place(self, session: str | None = None) -> dict:
        """The node for a new call, or {"refused": reason} when no node can take it."""
        try:
            p = self.d.place(session)
        except FleetFull as exc:
            return {"refused": exc.reason, "message": str(exc)}
        return {"session": p.session, "node": p.node, "endpoint": p.endpoint,
                "incarnation": p.incarnation}

    def place_many(self, sessions: list[str | None]) -> list[dict]:
        """`place` for each, in order (a client's placements asked while its last was in
        flight)."""
        return [self.place(s) for s in sessions]

    def locate(self, session: str) -> dict | None:
        p = self.d.locate(session)
        return None if p is None else {"node": p.node, "endpoint": p.endpoint,
                                       "incarnation": p.incarnation}

    def closed(self, session: str) -> bool:
        return self.d.closed(session)

    def closed_many(self, sessions: list[str]) -> int:
        """Several calls ended (a client's watch period of closes): how many it held."""
        return sum(self.d.closed(s) for s in sessions)

    def give_back(self, session: str) -> bool:
        return self.d.give_back(session)

    def report(self, headrooms: dict[str, float],
               events: dict[str, tuple[int, list[tuple[str, str]]]] | None = None) -> None:
        """A watch period's word from the nodes, in one message: each node's beat headroom and
        the sessions it opened and closed (with the incarnation that said so). Placements no
        node confirmed in OPEN_GRACE_S are then given back (their bridge died before its open
        reached the node)."""
        for name, headroom_ms in headrooms.items():
            if name in self.d.nodes:
                self.d.report(name, headroom_ms)
        for name, (incarnation, said) in (events or {}).items():
            self.d.node_said(name, said, incarnation)
        self.d.expire(OPEN_GRACE_S)

    def drain(self, name: str) -> int:
        return self.d.drain(name)

    def undrain(self, name: str) -> None:
        self.d.undrain(name)

    def quiet(self, name: str, quiet: bool, incarnation: int | None = None) -> None:
        if self.d.current(name, incarnation) is not None:
            self.d.quiet(name, quiet)

    def live_on(self, name: str) -> int:
        return len(self.d.nodes[name].sessions) if name in self.d.nodes else 0

    def lost(self, name: str, incarnation: int | None = None) -> list[str] | None:
        """`name` lost; None (nothing done) where that node is gone or, given `incarnation`,
        a later incarnation has joined since (a loss seen late must not end the new one)."""
        if self.d.current(name, incarnation) is None:
            return None
        return self.d.lost(name)

    def leave(self, name: str) -> list[str]:
        return self.d.leave(name) if name in self.d.nodes else []

    def health(self) -> dict:
        """Each node's incarnation and whether it is alive: a client's calls on a node that is
        not, or on an earlier incarnation, are lost; and whether the directory is restoring
        (a node it does not know yet may still hold calls)."""
        return {"nodes": {name: (n.incarnation, n.alive) for name, n in self.d.nodes.items()},
                "restoring": self.restoring()}

    def stats(self) -> dict:
        """The directory's counts; `restarted`: this is a restarted directory (its state was
        said again by the nodes), `restoring`: they are still saying it."""
        return {**self.d.stats(), "restoring": self.restoring(), "restarted": self.restarted}
