"""A bounded, deterministic fuzzer of the node's ZMQ wire protocol (PROTOCOL.md).

    stats = await run("tcp://127.0.0.1:5555", count=2000, seed=1)
    # {"tried": 2000, "answered": 1730, "errors": ..., "refused": ..., "by_code": {...}, ...}

`count` messages go out from SOCKETS DEALER sockets (each its own routing identity), chosen by a
`random.Random(seed)`: the same seed sends the same messages in the same order (answers depend
on timing). The plan interleaves
  - a sweep, in seeded order, of every header field of every client message type in
    `protocol.CLIENT_TYPES` (read at run time, so new types are swept too) set to each value of
    WRONG, `v` included (True, 1.0 and "1" are not the int 1);
  - random cases: random bytes, broken and non-map msgpack, headers and payloads just under and
    just over the protocol's limits (and, at most OVERSIZE_MAX times a run, over the transport's,
    which may cost that socket its connection), floods of pings, messages for sessions nobody
    opened, closes and resumes of sessions other sockets (or `targets`, e.g. victims) own, and
    the fuzzer's own sessions fed odd payloads, duplicate and wild seqs.
`steal` lists routing identities to impersonate (other clients' ones): a socket connects under
each and tries to close `targets` through it; a node must not let that end their sessions.
Answers (every node message) are counted by type and error code. Nothing waits unbounded: sends
never block (a full queue counts the message `unsent`), and after the last one the fuzzer
listens for at most SETTLE_S.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import os
import random

import msgpack
import zmq
import zmq.asyncio

from chaos.quiet import fuzz_round, until_quiet
from transports import protocol as P
from transports import zsock

SOCKETS = 4
SETTLE_S = 1.5                  # listening for answers after the last message, at most
QUIET_S = 0.3                   # ... ended early by this long without one
OVERSIZE_MAX = 1                # messages past the transport's limit, per run
FLOOD = (100, 600)              # messages in one flood, low/high
FLOOD_EVERY = 1000              # one flood each time this many more messages have been tried
OPEN_WAIT_S = 3.0               # for the fuzzer's own sessions to open before the abuse starts
WRONG = (None, True, False, 0, -1, 1.0, 2 ** 63, -2 ** 63, "", "x", "1", "A" * 300, b"\x00\xff",
         [], [1, "a"], {}, {"a": {"b": [None]}})
VALID = {                       # a well-formed header of each type the fuzzer knows, less v/type
    "open": {"sample_rate": 16000, "format": "pcm_f32le", "output_sample_rate": 22050,
             "output_format": "pcm_s16le", "instructions": "", "tools": []},
    "audio": {"seq": 0},
    "function_result": {"call_id": "call-1", "output": "{}"},
    "close": {},
    "ping": {"nonce": 1},
    "resume": {"token": "0" * 32},
}


_MONITORS = itertools.count()


def _transport_limit() -> int:
    """The size past which the node's transport drops the connection (the protocol module names
    it where the node has one; otherwise the node's MAXMSGSIZE of header + payload limits)."""
    return getattr(P, "TRANSPORT_MAX_BYTES", P.MAX_PAYLOAD_BYTES + P.MAX_HEADER_BYTES)


def sweep_plan(rng: random.Random) -> list[tuple[str, str, object]]:
    """(type, field, wrong value) for every field of every client type, in a seeded order."""
    plan = []
    for type_ in P.CLIENT_TYPES:
        fields = ["v", "type", "session", *VALID.get(type_, {})]
        plan += [(type_, f, value) for f in fields for value in WRONG]
    rng.shuffle(plan)
    return plan


class _Sock:
    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, identity: bytes):
        self.identity = identity
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RECONNECT_IVL, 100)
        # A unique address: pyzmq's default is named after the fd, which a later socket reuses
        # while the closed one's monitor endpoint may still be bound.
        self.monitor = self.sock.get_monitor_socket(
            zmq.EVENT_DISCONNECTED, addr=f"inproc://chaos-fuzz-monitor-{next(_MONITORS)}")
        self.sock.connect(endpoint)
        self.tx = zsock.Tx(self.sock)
        self.sessions: list[str] = []            # opened by this socket, not yet closed


class Fuzzer:
    def __init__(self, endpoint: str, seed: int, targets=(), steal=(), rate: float = 2000.0):
        self.endpoint, self.rng, self.rate = endpoint, random.Random(seed), rate
        self.targets, self.steal = list(targets), list(steal)
        self.tag = f"fz{seed % 10000}"
        self.ctx = zmq.asyncio.Context.instance()
        self.socks: list[_Sock] = []
        self.thieves: list[_Sock] = []
        self.tasks: list[asyncio.Task] = []
        self.stats = collections.Counter()
        self.by_type: collections.Counter = collections.Counter()
        self.by_code: collections.Counter = collections.Counter()
        self.last_answer = 0.0
        self.oversize = 0
        self.sweep = sweep_plan(self.rng)
        self.swept = 0

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for i in range(SOCKETS):
            self.socks.append(_Sock(self.ctx, self.endpoint, f"{self.tag}-{i}".encode()))
        self.thieves = [_Sock(self.ctx, self.endpoint, ident) for ident in self.steal]
        for s in self.socks + self.thieves:
            self.tasks += [loop.create_task(self._read(s)), loop.create_task(self._watch(s))]

    async def close(self) -> None:
        for s in self.socks:                     # our own sessions end with us
            for sid in s.sessions:
                self._send(s, P.pack("close", sid))
        await asyncio.sleep(0.05)
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for s in self.socks + self.thieves:
            s.sock.disable_monitor()
            s.monitor.close(0)
            s.sock.close(0)

    async def settle(self) -> None:
        await until_quiet(lambda: self.last_answer, SETTLE_S, QUIET_S)

    def report(self) -> dict:
        errors, refused = self.by_type["error"], self.by_type["refused"]
        return {"tried": self.stats["tried"], "unsent": self.stats["unsent"],
                "answered": errors + refused, "errors": errors, "refused": refused,
                "by_type": dict(self.by_type), "by_code": dict(self.by_code),
                "disconnects": self.stats["disconnects"], "oversize_sent": self.oversize,
                "stolen": self.stats["stolen"],
                "sweep_covered": self.swept, "sweep_total": len(self.sweep),
                "sessions_opened": self.by_type["opened"]}

    async def _read(self, s: _Sock) -> None:
        loop = asyncio.get_running_loop()
        while True:
            frames = await s.sock.recv_multipart()
            self.last_answer = loop.time()
            try:
                header = msgpack.unpackb(frames[0], raw=False)
                type_ = str(header.get("type"))
            except Exception:                       # an unreadable answer is itself a finding
                self.by_type["undecodable"] += 1
                continue
            self.by_type[type_] += 1
            if s in self.thieves and header.get("session") in self.targets:
                self.stats["stolen"] += 1           # another client's session spoke to us
            if type_ in ("error", "refused"):
                self.by_code[str(header.get("code", header.get("reason")))] += 1
            elif type_ == "opened" and header.get("session") not in s.sessions:
                s.sessions.append(header.get("session"))
            elif type_ == "closed" and header.get("session") in s.sessions:
                s.sessions.remove(header.get("session"))

    async def _watch(self, s: _Sock) -> None:
        from zmq.utils.monitor import recv_monitor_message
        while True:
            await recv_monitor_message(s.monitor)
            self.stats["disconnects"] += 1

    # ---- sending ----------------------------------------------------------------------------

    def _send(self, s: _Sock, frames: list[bytes]) -> None:
        self.stats["tried"] += 1
        try:
            s.tx.send(frames)
        except zmq.ZMQError:                   # queue full, or not connected yet: not waited for
            self.stats["unsent"] += 1

    async def fuzz(self, count: int) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i, s in enumerate(self.socks):        # sessions to abuse and to close from elsewhere
            self._send(s, P.pack("open", f"{self.tag}-{i}", **VALID["open"]))
        while loop.time() - start < OPEN_WAIT_S and not all(s.sessions for s in self.socks):
            await asyncio.sleep(0.05)
        start = loop.time()
        cases = [self._random_bytes, self._broken_msgpack, self._not_a_map, self._bad_version,
                 self._limits, self._unknown_session, self._others_sessions, self._own_session,
                 self._frames_count]
        floods = 0
        while self.stats["tried"] < count:
            if self.stats["tried"] >= (floods + 1) * FLOOD_EVERY:
                floods += 1
                self._flood(count - self.stats["tried"])
            elif self.swept < len(self.sweep) and self.rng.random() < 0.5:
                self._swept_case()
            else:
                self.rng.choice(cases)(count - self.stats["tried"])
            ahead = start + self.stats["tried"] / self.rate - loop.time()
            await asyncio.sleep(max(0.0, ahead))       # paced: a flood is a burst, not the rate

    def _pick(self) -> _Sock:
        return self.socks[self.rng.randrange(len(self.socks))]

    def _sid(self) -> str:
        return f"{self.tag}-nobody-{self.rng.randrange(10 ** 6)}"

    # ---- cases (each sends at least one message, at most `left`) ------------------------------

    def _swept_case(self) -> None:
        type_, field, value = self.sweep[self.swept]
        self.swept += 1
        header = {"v": P.VERSION, "type": type_, "session": self._sid(), **VALID.get(type_, {})}
        header[field] = value
        payload = [os.urandom(1280 * 4)] if type_ == "audio" else []
        self._send(self._pick(), [msgpack.packb(header, use_bin_type=True), *payload])

    def _random_bytes(self, left: int) -> None:
        n = self.rng.randint(1, 3)
        self._send(self._pick(), [self.rng.randbytes(self.rng.randrange(300)) for _ in range(n)])

    def _broken_msgpack(self, left: int) -> None:
        good = msgpack.packb({"v": 1, "type": "ping", "nonce": "x" * 40})
        variants = [good[: self.rng.randrange(1, len(good))],      # truncated
                    b"\xc1" + good,                                  # a byte msgpack never uses
                    b"\x81\x01\x02",                                 # a map with an int key
                    b"\xdf\xff\xff\xff\xff",                         # a map claiming 4G entries
                    b"\x91" * 5000 + b"\xc0"]                        # lists nested 5000 deep
        self._send(self._pick(), [self.rng.choice(variants)])

    def _not_a_map(self, left: int) -> None:
        value = self.rng.choice([[1, 2], 7, "open", None, True, b"raw", 1.5])
        self._send(self._pick(), [msgpack.packb(value, use_bin_type=True)])

    def _bad_version(self, left: int) -> None:
        header = {"type": "ping", "nonce": 2}
        v = self.rng.choice([True, 1.0, "1", 0, 2, None, -1, "missing"])
        if v != "missing":
            header["v"] = v
        self._send(self._pick(), [msgpack.packb(header)])

    def _limits(self, left: int) -> None:
        """Headers and payloads at the protocol's limits, one byte either side."""
        sid = self._sid()
        pad = P.MAX_HEADER_BYTES - len(msgpack.packb({"v": 1, "type": "ping", "nonce": ""})) - 5
        over = self.rng.random() < 0.5
        choice = self.rng.randrange(3 if self.oversize >= OVERSIZE_MAX else 4)
        if choice == 0:                                # a header just under or over its limit
            frames = P.pack("ping", nonce="n" * (pad + (64 if over else -64)))
        elif choice == 1:                              # a payload at or past its limit
            frames = P.pack("audio", sid, bytes(P.MAX_PAYLOAD_BYTES + (1 if over else 0)), seq=0)
        elif choice == 2:                              # a big payload where none is allowed
            frames = P.pack("close", sid, bytes(self.rng.randrange(1, 1 << 16)))
        else:                                          # past the transport: costs a connection
            self.oversize += 1
            frames = P.pack("audio", sid, bytes(_transport_limit() + 1), seq=0)
        self._send(self._pick(), frames)

    def _flood(self, left: int) -> None:
        s = self._pick()
        for i in range(min(left, self.rng.randint(*FLOOD))):
            self._send(s, P.pack("ping", nonce=i))

    def _unknown_session(self, left: int) -> None:
        type_ = self.rng.choice([t for t in P.CLIENT_TYPES if t not in ("open", "ping")])
        payload = bytes(5120) if type_ == "audio" else None
        self._send(self._pick(), P.pack(type_, self._sid(), payload,
                                        **VALID.get(type_, {})))

    def _others_sessions(self, left: int) -> None:
        """Close, resume, feed and answer for a session another socket (or a victim) owns."""
        owner = self.rng.randrange(len(self.socks))
        sid = self.rng.choice(self.targets + [f"{self.tag}-{owner}"])
        type_ = self.rng.choice([t for t in P.CLIENT_TYPES if t not in ("open", "ping")])
        payload = bytes(5120) if type_ == "audio" else None
        fields = {**VALID.get(type_, {})}
        if type_ == "audio":
            fields["seq"] = self.rng.randrange(1 << 20)
        if self.thieves and self.rng.random() < 0.3:
            s = self.rng.choice(self.thieves)          # under the owner's own routing identity
        else:
            s = self.socks[(owner + 1 + self.rng.randrange(len(self.socks) - 1)) % len(self.socks)]
        self._send(s, P.pack(type_, sid, payload, **fields))

    def _own_session(self, left: int) -> None:
        """A session this socket opened, fed what a sloppy client sends."""
        i = self.rng.randrange(len(self.socks))
        s, sid = self.socks[i], f"{self.tag}-{i}"
        kind = self.rng.randrange(8)
        if kind == 0:                                   # odd bytes: not whole f32 samples
            frames = P.pack("audio", sid, bytes(self.rng.randrange(1, 4) + 4 * 100), seq=0)
        elif kind == 1:                                 # seqs duplicate, far ahead, near 2^63
            seq = self.rng.choice([0, 1, 1 << 40, (1 << 63) - 1])
            frames = P.pack("audio", sid, bytes(1280 * 4), seq=seq)
        elif kind == 2:                                 # an answer to a call never made
            frames = P.pack("function_result", sid, call_id="never", output="x" * 1000)
        elif kind in (3, 4, 5, 6):                      # opened twice
            frames = P.pack("open", sid, **VALID["open"])
        else:                                           # closed, then opened again at once
            frames = P.pack("close", sid)
            self._send(s, frames)
            frames = P.pack("open", sid, **VALID["open"])
        self._send(s, frames)

    def _frames_count(self, left: int) -> None:
        """Three frames, or an empty header frame."""
        self._send(self._pick(), self.rng.choice([[msgpack.packb({"v": 1, "type": "ping"}),
                                                   b"a", b"b"], [b""], [b"", b""]]))


async def run(endpoint: str, count: int, seed: int, targets=(), steal=(),
              rate: float = 2000.0) -> dict:
    """Send `count` fuzz messages to the node at `endpoint`; the counts of what came back."""
    fz = Fuzzer(endpoint, seed, targets, steal, rate)
    fz.start()
    return await fuzz_round(fz, count)
