"""A client whose connection went quiet redials under a fresh routing identity and resumes its
sessions by token. Real ZMQ sockets: a ROUTER standing in for a node that stops answering."""
import asyncio
import threading
import time

import zmq
import zmq.asyncio

from transports import protocol as P
from transports.client import NodeClient

TOKEN = "t" * 32


def test_a_client_the_node_stopped_hearing_redials_under_a_fresh_identity():
    """Bug: a client whose old connection the node still held (half-open there after a change
    of network) reconnected under the same identity, which libzmq never attaches while the old
    one lives: nothing it sent was read, nothing reached it, and it waited forever. It now
    takes 3 heartbeats without a word from the node for a dead connection, redials under a
    fresh identity, and sends `resume` with each session's token before anything else."""
    async def body():
        node = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        node.setsockopt(zmq.LINGER, 0)
        endpoint = f"tcp://127.0.0.1:{node.bind_to_random_port('tcp://127.0.0.1')}"
        client = NodeClient(endpoint, identity=b"first")
        client.connect()
        try:
            opening = asyncio.ensure_future(client.open("call"))
            ident, *frames = await asyncio.wait_for(node.recv_multipart(), 5)
            assert P.parse(frames).type == "open"
            await node.send_multipart([ident, *P.pack("opened", "call", token=TOKEN,
                                                      heartbeat_ms=200, frame_ms=80)])
            s = await asyncio.wait_for(opening, 5)
            await s.send_audio(bytes(5120))
            heard = []                      # the node reads on, but answers nothing more
            loop = asyncio.get_running_loop()
            end = loop.time() + 5
            while loop.time() < end:
                ident, *frames = await asyncio.wait_for(node.recv_multipart(), 5)
                msg = P.parse(frames)
                heard.append((ident, msg.type))
                if ident != b"first":
                    break
            assert ident != b"first", "no redial in 5 s"
            assert msg.type == "resume" and msg.header["token"] == TOKEN
            assert ident == client.identity and len(ident) > 32
            assert ("first", "ping") in [(i.decode(), t) for i, t in heard]
        finally:
            await client.aclose()
            node.close(0)
    asyncio.run(body())


def slow_reader(name: str) -> tuple[zmq.Socket, NodeClient]:
    """A node's ROUTER that holds one message, read by the test itself (room comes only when it
    reads), and a client whose send queue holds one: inproc, so no kernel buffers hide room."""
    ctx = zmq.asyncio.Context.instance()
    node = zmq.Context.shadow(ctx.underlying).socket(zmq.ROUTER)
    node.setsockopt(zmq.LINGER, 0)
    node.setsockopt(zmq.RCVHWM, 1)
    endpoint = f"inproc://slow-reader-{name}"
    node.bind(endpoint)
    client = NodeClient(endpoint, identity=name.encode())
    client.sock.setsockopt(zmq.SNDHWM, 1)
    client.connect()
    return node, client


async def fill_until_a_send_waits(client: NodeClient) -> int:
    """Pings a0, a1, ... until one waits for room; returns how many went out before it."""
    sent = 0
    while True:
        waiting = asyncio.ensure_future(client.send(P.pack("ping", f"a{sent}")))
        await asyncio.sleep(0.05)
        if not waiting.done():
            return sent
        sent += 1


def test_a_message_sent_from_a_callback_never_passes_a_send_that_waits_for_room():
    """Bug: `send_soon` (a `resume`, a `close`, a ping, sent from a callback) tried the socket
    at once whenever it had room, so where a session's audio waited for room and room came, the
    callback's message went out ahead of that audio. It now queues behind every send begun."""
    async def body():
        node, client = slow_reader("one")
        try:
            sent = await fill_until_a_send_waits(client)
            # the node's side read synchronously: room comes while the client's loop stands still
            order = [P.parse(node.recv_multipart()[1:]).session]     # room for one
            time.sleep(0.05)
            client.send_soon(P.pack("ping", "marker"))
            loop = asyncio.get_running_loop()
            end = loop.time() + 3
            while "marker" not in order and loop.time() < end:
                if node.poll(0):
                    order.append(P.parse(node.recv_multipart()[1:]).session)
                else:
                    await asyncio.sleep(0.01)    # the client's loop sends what waits
            assert order == [f"a{i}" for i in range(sent + 1)] + ["marker"], order
        finally:
            await client.aclose()
            node.close(0)
    asyncio.run(body())


def test_a_send_asked_after_a_callbacks_message_never_passes_it():
    """Bug: `send_soon` behind a waiting send queued its message from a task that took its
    place in line only when it first ran, so a send the same coroutine asked right after (in
    the same turn of the loop) got ahead of it: a `close` could pass the `resume` before it."""
    async def body():
        node, client = slow_reader("two")
        order: list[str] = []

        def read():                              # the node, in its own thread: room comes
            end = time.monotonic() + 5
            while "after" not in order and time.monotonic() < end:
                if node.poll(50):
                    order.append(P.parse(node.recv_multipart()[1:]).session)
        try:
            sent = await fill_until_a_send_waits(client)
            client.send_soon(P.pack("ping", "marker"))
            reader = threading.Thread(target=read)
            reader.start()
            await client.send(P.pack("ping", "after"))
            await asyncio.get_running_loop().run_in_executor(None, reader.join)
            assert order == [f"a{i}" for i in range(sent + 1)] + ["marker", "after"], order
        finally:
            await client.aclose()
            node.close(0)
    asyncio.run(body())
