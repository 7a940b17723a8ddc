"""Who may drive a session, and where its messages go: the node's one map of client sessions.

A route is a session from its `open` until it is forgotten. It is bound to the connection that
opened or last resumed it (connections are numbered by `gatekeeper.py`; a routing identity is
chosen by the client and proves nothing), and with CURVE to the key that opened it. A route is
*detached* when its connection is gone: a probe at a new connection found none, the identity
came back on another connection, or its client went quiet for longer than the silence limit. A detached route hears nothing and its outputs are held or counted; `resume`
with its token (or, under CURVE, from its key) binds it to the caller's connection again.

Pure bookkeeping on an injected `now`: no sockets, no asyncio (the node sends and closes).
"""
from __future__ import annotations

import collections
import hmac
import secrets
from dataclasses import dataclass, field
from typing import Any

from transports import protocol as P

RECENTLY_CLOSED = 1024      # closed sessions whose stats a resume can still fetch


@dataclass
class Peer:
    """A routing identity as last heard: on which connection, and when. The sender (flood key)
    and CURVE key belong to the connection, so they are read once per connection."""
    conn: str
    heard: float
    sender: str = ""
    user_key: str | None = None


@dataclass(eq=False)
class Route:
    identity: bytes                     # where its messages go while it is bound
    session: str
    owner_key: str | None               # the CURVE key that opened it (None without CURVE)
    sender: str                         # its flood-limit key (CURVE key or network address)
    conn: str                           # the connection it is bound to
    token: str = field(default_factory=lambda: secrets.token_hex(P.TOKEN_BYTES))
    handle: Any = None                  # once admitted (the clock's Handle)
    actor: Any = None                   # once opened (its SessionActor)
    ready: Any = None                   # asyncio.Future while its start runs
    cancelled: bool = False             # closed by its client before `opened`
    detached_at: float | None = None    # None while bound to `conn`
    last_heard: float = 0.0             # its last audio, function result or ping
    next_seq: int = 0                   # past the highest audio seq the front accepted
    held: collections.deque = field(default_factory=collections.deque)  # while detached
    shed_out: int = 0                   # its audio the front queued, then shed (a slow client)

    @property
    def child(self) -> str:
        """Its actor's name under the supervisor (stable across resumes)."""
        return f"session:{self.token}"

    @property
    def live(self) -> bool:
        return self.actor is not None and not self.actor.closing


class Bindings:
    def __init__(self):
        self.routes: dict[tuple[bytes, str], Route] = {}
        self.peers: dict[bytes, Peer] = {}
        self.sessions_of: dict[str, int] = {}          # opened sessions per sender
        self._by_token: dict[str, Route] = {}
        self._recently_closed: collections.OrderedDict[str, tuple[str, str | None, dict]] = \
            collections.OrderedDict()                   # token → (session, key, stats)
        self.detached = 0
        self.resumed = 0

    # -- a route's life ---------------------------------------------------------------------------
    def get(self, identity: bytes, session: str) -> Route | None:
        return self.routes.get((identity, session))

    def add(self, route: Route) -> None:
        self.routes[(route.identity, route.session)] = route

    def opened(self, route: Route, now: float) -> None:
        route.last_heard = now
        self._by_token[route.token] = route
        self.sessions_of[route.sender] = self.sessions_of.get(route.sender, 0) + 1

    def drop(self, route: Route) -> None:
        if self.routes.get((route.identity, route.session)) is route:
            del self.routes[(route.identity, route.session)]

    def forget(self, route: Route, stats: dict | None = None) -> None:
        """The session closed: its stats stay fetchable by its token for a while."""
        self.drop(route)
        if self._by_token.get(route.token) is route:
            del self._by_token[route.token]
            left = self.sessions_of.get(route.sender, 1) - 1
            if left > 0:
                self.sessions_of[route.sender] = left
            else:
                self.sessions_of.pop(route.sender, None)
        if stats is not None:
            self._recently_closed[route.token] = (route.session, route.owner_key, stats)
            while len(self._recently_closed) > RECENTLY_CLOSED:
                self._recently_closed.popitem(last=False)

    # -- liveness ---------------------------------------------------------------------------------
    def connected(self, identity: bytes, conn: str, now: float, sender: str,
                  user_key: str | None) -> Peer:
        """The first message from `identity` on connection `conn`: a new connection detaches
        the identity's sessions bound to its old one."""
        peer = self.peers.get(identity)
        if peer is not None and peer.conn != conn:
            self.detach_identity(identity, now, keep_conn=conn)
        peer = self.peers[identity] = Peer(conn, now, sender, user_key)
        return peer

    def detach(self, route: Route, now: float) -> bool:
        if route.detached_at is not None or not route.live:
            return False
        route.detached_at = now
        self.detached += 1
        return True

    def detach_identity(self, identity: bytes, now: float, keep_conn: str | None = None) -> None:
        for route in list(self.routes.values()):
            if route.identity == identity and route.conn != keep_conn:
                self.detach(route, now)

    def bound_identities(self) -> set[bytes]:
        return {r.identity for r in self.routes.values() if r.live and r.detached_at is None}

    def due(self, now: float, silence_limit_s: float, idle_timeout_s: float,
            resume_grace_s: float) -> list[tuple[Route, str]]:
        """Detaches the routes whose client went quiet; returns those to close, with why:
        `idle` (bound, nothing of its own heard) or `lost` (detached past the grace)."""
        closing = []
        for route in list(self.routes.values()):
            if not route.live:
                continue
            if route.detached_at is None:
                peer = self.peers.get(route.identity)
                # Silence counts from `opened` at the earliest: that is where the client learns
                # how often to ping (a slow start is no silence of the client's).
                if peer is None or now - max(peer.heard, route.last_heard) > silence_limit_s:
                    self.detach(route, now)
                elif now - route.last_heard > idle_timeout_s:
                    closing.append((route, "idle"))
            elif now - route.detached_at > resume_grace_s:
                closing.append((route, "lost"))
        return closing

    def forget_quiet_peers(self, now: float, silence_limit_s: float, keep: int) -> None:
        """Peers beyond `keep` that own no route and are quiet are forgotten (bounded memory)."""
        if len(self.peers) <= keep:
            return
        owners = {r.identity for r in self.routes.values()}
        for identity in [i for i, p in self.peers.items()
                         if i not in owners and now - p.heard > silence_limit_s]:
            del self.peers[identity]

    # -- who may drive a session ------------------------------------------------------------------
    def check(self, identity: bytes, user_key: str | None, conn: str,
              session: str) -> tuple[Route | None, str, str]:
        """(route, "", "") when this connection may drive the opened session it names; else
        (None, error code, message for a person)."""
        route = self.routes.get((identity, session))
        if route is None or not route.live:
            return None, P.UNKNOWN_SESSION, f"no live session {session!r} on this connection"
        if route.owner_key != user_key:
            return None, P.FORBIDDEN, "this session belongs to another key"
        if route.detached_at is not None or route.conn != conn:
            return None, P.DETACHED, ("this session is detached from this connection; send "
                                      "`resume` with its token")
        return route, "", ""

    def resumable(self, session: str, token: str | None, user_key: str | None) -> Route | None:
        """The live route a `resume` names: by its token, or under CURVE (no token) by the key
        that opened it. Tokens are compared in constant time."""
        route = self._by_token.get(token) if token else None
        if route is not None and not hmac.compare_digest(route.token, token):
            route = None
        if route is None and token is None and user_key is not None:
            route = next((r for r in self.routes.values()
                          if r.session == session and r.owner_key == user_key), None)
        if route is None or route.session != session or route.owner_key != user_key \
                or not route.live:
            return None
        return route

    def closed_stats(self, session: str, token: str | None, user_key: str | None) -> dict | None:
        """The `closed` stats of a session that ended while its client was away."""
        closed = self._recently_closed.get(token or "")
        if closed is not None and closed[0] == session and closed[1] == user_key:
            return closed[2]
        return None

    def rebind(self, route: Route, identity: bytes, conn: str, now: float) -> bool:
        """Binds a route to a connection; False when that identity already has another
        session of this name."""
        key = (identity, route.session)
        if self.routes.get(key, route) is not route:
            return False
        self.drop(route)
        route.identity, route.conn = identity, conn
        self.routes[key] = route
        route.detached_at, route.last_heard = None, now
        self.resumed += 1
        return True
