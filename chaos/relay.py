"""A loopback TCP relay between clients and a server that misbehaves on command.

    relay = Relay("127.0.0.1", node_port)
    port = await relay.start()          # clients connect here instead of to the server
    relay.reset()                       # every connection ends with an RST, both sides
    relay.refuse_for(2.0)               # new connections are reset at once for 2 s
    relay.set_delay(50)                 # bytes arrive 50 ms late, in order, both directions
    relay.drop()                        # the newest connection ends with a FIN, both sides
    await relay.close()

Each accepted connection gets its own connection to the target and two one-way pumps. A pump
reads what arrives, stamps it with the time it may leave (now + delay) and a writer sends it at
that time, so a delay adds latency without cutting throughput. An RST is a close with SO_LINGER
0: the kernel discards unsent bytes and the peer reads ECONNRESET, as when a NAT or a load
balancer forgets a flow. "Refused" is an accept followed by an RST (the listening port stays
ours, so nobody can take it meanwhile); a ZMQ peer sees it as a failed connection and retries.
"""
from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass, field

CHUNK = 64 << 10
CONNECT_TIMEOUT_S = 5.0


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER 0: an RST, not a FIN; queued bytes are thrown away."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass                       # already closed
    writer.transport.abort()


@dataclass(eq=False)
class _Pair:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    tasks: list = field(default_factory=list)

    def rst(self) -> None:
        for task in self.tasks:
            task.cancel()
        _rst(self.client)
        _rst(self.server)

    def fin(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.client.close()
        self.server.close()


class Relay:
    def __init__(self, target_host: str, target_port: int, host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self.host = host
        self.delay_s = 0.0
        self._server: asyncio.Server | None = None
        self._pairs: list[_Pair] = []           # oldest first
        self._handlers: set[asyncio.Task] = set()   # one per accepted connection, until it ends
        self._refuse_until = 0.0
        self.stats = {"accepted": 0, "refused": 0, "resets": 0, "connections_reset": 0,
                      "dropped": 0, "bytes_up": 0, "bytes_down": 0}

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        return self.port

    @property
    def port(self) -> int:
        return self._server.sockets[0].getsockname()[1]

    @property
    def connections(self) -> int:
        return len(self._pairs)

    # ---- commands ---------------------------------------------------------------------------

    def reset(self) -> int:
        """RST every open connection, both sides; returns how many."""
        n = self._rst_all()
        self.stats["resets"] += 1
        self.stats["connections_reset"] += n
        return n

    def _rst_all(self) -> int:
        pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.rst()
        return len(pairs)

    def refuse_for(self, seconds: float) -> None:
        """Reset every new connection for `seconds` from now (0 ends a refusal early)."""
        self._refuse_until = asyncio.get_running_loop().time() + seconds

    def set_delay(self, ms: float) -> None:
        """Bytes read from now on leave `ms` later (order kept; queued bytes keep their time)."""
        self.delay_s = max(0.0, ms) / 1000.0

    def drop(self) -> bool:
        """End the newest connection with a FIN on both sides; False if there was none."""
        if not self._pairs:
            return False
        self._pairs.pop().fin()
        self.stats["dropped"] += 1
        return True

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._rst_all()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    # ---- forwarding -------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() < self._refuse_until:
            self.stats["refused"] += 1
            return _rst(writer)
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.target), CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            self.stats["refused"] += 1           # the target is down: the client sees a refusal
            return _rst(writer)
        self.stats["accepted"] += 1
        pair = _Pair(writer, up_writer)
        pair.tasks = [loop.create_task(self._pump(reader, up_writer, "bytes_up")),
                      loop.create_task(self._pump(up_reader, writer, "bytes_down"))]
        self._pairs.append(pair)
        me = asyncio.current_task()
        self._handlers.add(me)
        try:
            await asyncio.wait(pair.tasks, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:       # close(): the handler ends quietly, RST sent
            pair.rst()
            return
        finally:
            self._handlers.discard(me)
        # One side ended (EOF or error): end the other the same way a proxy would, with a FIN.
        if pair in self._pairs:
            self._pairs.remove(pair)
            pair.fin()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, key: str) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        writer = loop.create_task(self._deliver(queue, dst))
        try:
            while True:
                data = await src.read(CHUNK)
                if not data:
                    break
                self.stats[key] += len(data)
                queue.put_nowait((loop.time() + self.delay_s, data))
            queue.put_nowait((0.0, b""))            # EOF after what is queued
            await writer
        except (ConnectionError, OSError):
            pass
        finally:
            writer.cancel()

    @staticmethod
    async def _deliver(queue: asyncio.Queue, dst: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await queue.get()
            if not data:
                if dst.can_write_eof():
                    dst.write_eof()
                return
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            dst.write(data)
            await dst.drain()
