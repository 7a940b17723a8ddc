"""The fleet's directory: which node holds each session, what each node has free, which nodes
are draining. One owner of that state (in the fleet, a named Ray actor holds one `Directory`);
the nodes and entry points ask it, and keep no copy.

A call's slot is counted the moment it is placed, not at the node's next load report, so a
burst spreads over the nodes instead of landing where the last report said there was room. A
placement is held against its node until the call closes, the placement is given back (the
node refused it) or the node is lost. A draining node takes no new call; its live calls stay
where they are. A lost node's sessions are forgotten and handed back to be ended: their state
was on its GPU, so no other node can carry them on.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from wave_actors.fleet.placement import DEFAULT, NodeLoad, OpenNodes, Placement, policy


class FleetFull(Exception):
    """No node can take a call now: `reason` is `capacity` (every node is full) or `no_nodes`
    (none alive and taking calls)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class UnknownNode(KeyError):
    pass


@dataclass
class Node:
    load: NodeLoad
    endpoint: str
    incarnation: int = 0
    draining: bool = False
    alive: bool = True              # False from its loss until it joins again
    # missed its last reading: takes no new call, keeps its calls (slow is not dead)
    quiet: bool = False
    sessions: set[str] = field(default_factory=set)

    @property
    def takes_calls(self) -> bool:
        return self.alive and not self.quiet and not self.draining and self.load.free > 0


@dataclass(frozen=True)
class Placed:
    session: str
    node: str
    endpoint: str
    incarnation: int


@dataclass
class Counters:
    placements: int = 0
    closes: int = 0
    given_back: int = 0
    lost_sessions: int = 0
    taken_in: int = 0               # sessions a node said it opened that were not placed here
    refusals: dict[str, int] = field(default_factory=dict)     # by reason


class Directory:
    def __init__(self, placement: str | Placement = DEFAULT, seed: int = 0, first: int = 0):
        """`first`: the incarnation a node new to this directory joins with. A directory that
        restarted gives one above any its predecessor gave, so a node restarted meanwhile is
        never taken for the incarnation its old calls were placed on."""
        self.first_incarnation = first
        self.placement = policy(placement) if isinstance(placement, str) else placement
        self.rng = random.Random(seed)
        self.nodes: dict[str, Node] = {}
        self.where: dict[str, str] = {}        # session → node name
        # placements no node has said it opened yet → when placed (time.monotonic), oldest first
        self.unconfirmed: dict[str, float] = {}
        self.open = OpenNodes()                 # the nodes placement may pick, kept current
        self.counters = Counters()
        self._seq = 0

    # -- nodes ------------------------------------------------------------------------------
    def join(self, name: str, endpoint: str, slots: int) -> int:
        """A node (new, or restarted under its name) takes calls; its incarnation. A restarted
        node's earlier sessions are gone with its GPU state: they are forgotten."""
        if slots < 1:
            raise ValueError(f"node {name}: slots >= 1, not {slots}")
        old = self.nodes.get(name)
        if old is not None:
            self.lost(name)
        incarnation = self.first_incarnation if old is None else old.incarnation + 1
        self.nodes[name] = node = Node(NodeLoad(name, slots), endpoint, incarnation)
        self._changed(node)
        return incarnation

    def restore(self, name: str, endpoint: str, slots: int, incarnation: int,
                sessions: list[str]) -> bool:
        """A running node says again what it holds, to a directory that lost its state (its
        process restarted): the node, its incarnation and its live sessions as they were.
        False (nothing done) where the name is known here already: it joined or was restored
        since, and its word then is newer."""
        if name in self.nodes:
            return False
        self.nodes[name] = node = Node(NodeLoad(name, slots), endpoint, incarnation)
        for session in sessions:
            if session not in self.where:
                node.sessions.add(session)
                self.where[session] = name
        node.load.used = len(node.sessions)
        self._changed(node)
        return True

    def report(self, name: str, headroom_ms: float) -> None:
        """A node's load report: its beat headroom (its slots are counted here)."""
        node = self._node(name)
        node.load.headroom_ms = float(headroom_ms)
        self._changed(node)

    def drain(self, name: str) -> int:
        """No new calls to `name`; its live calls stay. Returns how many are live there."""
        node = self._node(name)
        node.draining = True
        self._changed(node)
        return len(node.sessions)

    def current(self, name: str, incarnation: int | None = None) -> Node | None:
        """The node `name`, None where it is not here or, given `incarnation`, another
        incarnation holds the name now (word from an earlier one is stale)."""
        node = self.nodes.get(name)
        if node is None or incarnation not in (None, node.incarnation):
            return None
        return node

    def quiet(self, name: str, quiet: bool) -> None:
        """`name` did not answer its last reading (True) or answers again (False). A quiet
        node keeps its calls but is left out of placement: a call placed there would wait on
        a node that may be about to be declared lost."""
        node = self._node(name)
        node.quiet = quiet
        self._changed(node)

    def undrain(self, name: str) -> None:
        """A drain called off: the node takes calls again."""
        node = self._node(name)
        node.draining = False
        self._changed(node)

    def leave(self, name: str) -> list[str]:
        """A node stops (drained, or told to go): out of the directory. The sessions it still
        held are returned (a drained node holds none)."""
        gone = self.lost(name)
        del self.nodes[name]
        return gone

    def lost(self, name: str) -> list[str]:
        """`name` died: its sessions are forgotten and returned, to be ended at their callers;
        it takes no call until it joins again (its next incarnation), with every slot free."""
        node = self._node(name)
        node.alive = False
        gone = sorted(node.sessions)
        for session in gone:
            del self.where[session]
            self.unconfirmed.pop(session, None)
        node.sessions.clear()
        node.load.used = 0
        self._changed(node)
        self.counters.lost_sessions += len(gone)
        return gone

    # -- calls ------------------------------------------------------------------------------
    def place(self, session: str | None = None) -> Placed:
        """A node for a new call, its slot counted now. Raises FleetFull where none can take
        it; a session already placed keeps its node (a retried placement is not a second
        call)."""
        if session is not None and session in self.where:
            node = self.nodes[self.where[session]]
            return Placed(session, node.load.name, node.endpoint, node.incarnation)
        if not self.open:
            reason = ("capacity" if any(n.alive and not n.draining
                                        for n in self.nodes.values()) else "no_nodes")
            self.counters.refusals[reason] = self.counters.refusals.get(reason, 0) + 1
            raise FleetFull(reason, f"{len(self.nodes)} node(s), none with a free slot "
                                    "and taking calls")
        load = self.placement.pick(self.open, self.rng)
        node = self.nodes[load.name]
        while session is None or session in self.where:     # restored ids are taken
            self._seq += 1
            session = f"s{self._seq}"
        node.load.used += 1
        node.sessions.add(session)
        self._changed(node)
        self.where[session] = load.name
        self.unconfirmed[session] = time.monotonic()
        self.counters.placements += 1
        return Placed(session, load.name, node.endpoint, node.incarnation)

    def locate(self, session: str) -> Placed | None:
        """Where a session lives (a resume's node), None if it is not placed."""
        name = self.where.get(session)
        if name is None:
            return None
        node = self.nodes[name]
        return Placed(session, name, node.endpoint, node.incarnation)

    def closed(self, session: str) -> bool:
        """The call ended: its slot is free. False if the directory did not hold it (already
        closed, or its node was lost)."""
        return self._release(session, given_back=False)

    def node_said(self, name: str, events: list[tuple[str, str]],
                  incarnation: int | None = None) -> None:
        """The node `name`'s own word on its sessions, in order: ("opened", id) confirms a
        placement there; ("closed", id) frees it as a close. So a call whose bridge died with
        it live, which no client will report, frees its slot when its node closes it. A
        session the directory does not hold that the node says it opened is taken in (its
        placement expired, or was made before a directory restart and opened after the node
        restored it): it holds a slot there. Given `incarnation`, the word of another
        incarnation of the node is ignored (its sessions are gone)."""
        node = self.current(name, incarnation)
        if node is None:
            return
        for event, session in events:
            where = self.where.get(session)
            if event == "opened" and where is None:
                node.sessions.add(session)
                node.load.used += 1
                self.where[session] = name
                self.counters.taken_in += 1
                self._changed(node)
            elif where != name:
                continue
            elif event == "opened":
                self.unconfirmed.pop(session, None)
            elif event == "closed":
                self._release(session, given_back=False)

    def expire(self, grace_s: float, now: float | None = None) -> list[str]:
        """Give back the placements no node confirmed within `grace_s` of being placed (their
        bridge died before its open reached the node); returns them."""
        limit = (time.monotonic() if now is None else now) - grace_s
        old = []
        for session, at in self.unconfirmed.items():     # oldest first
            if at > limit:
                break
            old.append(session)
        for session in old:
            self._release(session, given_back=True)
        return old

    def give_back(self, session: str) -> bool:
        """The node refused a call placed on it: its slot is free again."""
        return self._release(session, given_back=True)

    def _release(self, session: str, given_back: bool) -> bool:
        name = self.where.pop(session, None)
        if name is None:
            return False
        self.unconfirmed.pop(session, None)
        node = self.nodes[name]
        node.sessions.discard(session)
        node.load.used -= 1
        self._changed(node)
        if given_back:
            self.counters.given_back += 1
        else:
            self.counters.closes += 1
        return True

    # -- reading ----------------------------------------------------------------------------
    def _changed(self, node: Node) -> None:
        self.open.update(node.load, node.takes_calls)

    def _node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise UnknownNode(name) from None

    def stats(self) -> dict:
        nodes = {n.load.name: {"slots": n.load.slots, "used": n.load.used,
                               "free": n.load.free, "headroom_ms": n.load.headroom_ms,
                               "draining": n.draining, "alive": n.alive,
                               "quiet": n.quiet,
                               "incarnation": n.incarnation,
                               "endpoint": n.endpoint}
                 for n in self.nodes.values()}
        c = self.counters
        return {"placement": self.placement.name, "nodes": nodes,
                "sessions": len(self.where), "unconfirmed": len(self.unconfirmed),
                "free_slots": sum(n.load.free for n in self.nodes.values()
                                  if n.alive and not n.draining),
                "placements": c.placements, "closes": c.closes, "given_back": c.given_back,
                "lost_sessions": c.lost_sessions, "taken_in": c.taken_in,
                "refusals": dict(c.refusals),
                "at": time.time()}
