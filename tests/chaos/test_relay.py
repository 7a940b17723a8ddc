"""The chaos relay does what the chaos run relies on, over real loopback TCP to a real echo server.

Bugs caught: a relay that loses or reorders bytes (with or without a delay), a `reset` that ends
connections with a FIN (peers would see a clean close, not the RST the suite means to inflict),
a refusal that lets connections through or never ends, a `drop` that leaves the connection up.
No timing is asserted: a delay is checked for order and completeness only.
"""
import asyncio
import contextlib

import pytest

from chaos.relay import Relay


async def echo_server() -> asyncio.Server:
    async def echo(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
    return await asyncio.start_server(echo, "127.0.0.1", 0)


async def roundtrip(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), 10)
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def relayed_echo():
    """A relay in front of an echo server: (relay, the relay's port)."""
    server = await echo_server()
    relay = Relay("127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        yield relay, await relay.start()
    finally:
        await relay.close()
        server.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))        # a bound for a hang, not a speed check


async def echoing(port: int, payload: bytes):
    """A connection through the relay whose first echo came back: (reader, writer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    assert await asyncio.wait_for(reader.readexactly(len(payload)), 10) == payload
    return reader, writer


def test_forwards_in_order_with_and_without_delay():
    async def go():
        async with relayed_echo() as (relay, port):
            data = bytes(range(256)) * 4096                   # 1 MiB: many reads and writes
            assert await roundtrip(port, data) == data
            relay.set_delay(20)
            assert await roundtrip(port, data) == data
            assert relay.stats["bytes_up"] == relay.stats["bytes_down"] == 2 * len(data)
    run(go())


def test_reset_sends_an_rst_to_the_client():
    async def go():
        async with relayed_echo() as (relay, port):
            reader, writer = await echoing(port, b"ping")
            assert relay.reset() == 1
            with pytest.raises(ConnectionResetError):       # an RST, not an EOF
                await asyncio.wait_for(reader.read(10), 10)
            writer.close()
            assert await roundtrip(port, b"again") == b"again"   # new connections still work
    run(go())


def test_refuse_for_resets_new_connections_until_lifted():
    async def go():
        async with relayed_echo() as (relay, port):
            relay.refuse_for(3600)
            with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
                await roundtrip(port, b"hello")
            assert relay.stats["refused"] == 1 and relay.stats["accepted"] == 0
            relay.refuse_for(0)
            assert await roundtrip(port, b"hello") == b"hello"
    run(go())


def test_drop_ends_the_newest_connection_with_eof():
    async def go():
        async with relayed_echo() as (relay, port):
            reader, writer = await echoing(port, b"x")
            assert relay.drop() is True
            assert await asyncio.wait_for(reader.read(10), 10) == b""      # FIN: end of stream
            writer.close()
            assert relay.drop() is False and relay.connections == 0
    run(go())
