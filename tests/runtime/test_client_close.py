"""A client closing while its connection's handshake finishes must leave its ZMQ context
working. Real sockets: a ROUTER standing in for a node, each client in a context of its own."""
import asyncio

import zmq
import zmq.asyncio

from transports.client import NodeClient

_STALLED = []       # a context whose I/O thread is stuck is never collected: its term() would hang


def _context_still_connects(ctx: zmq.asyncio.Context, endpoint: str) -> bool:
    """A fresh socket of `ctx` completes a handshake with the node within 2 s."""
    sync = zmq.Context.shadow(ctx.underlying)
    probe = sync.socket(zmq.DEALER)
    probe.linger = 0
    mon = probe.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED,
                                   addr=f"inproc://close-probe-{id(probe)}")
    probe.connect(endpoint)
    try:
        return bool(mon.poll(2000))
    finally:
        probe.disable_monitor()
        mon.close(0)
        probe.close(0)


def test_closing_during_the_handshake_never_stalls_the_contexts_io_thread():
    """Bug: `aclose` closed the handshake monitor's reader before the socket it watched; a
    handshake finishing in between made libzmq's I/O thread block for good sending that event
    (a pair socket with no peer), and every later connection of the context (the process's
    shared one, by default: every bridge call after it) waited until its open timed out as
    `node unavailable`. Closing a few hundred clients at every point of their handshake hit
    the window within ~75."""
    async def body():
        server_ctx = zmq.Context()
        node = server_ctx.socket(zmq.ROUTER)
        node.linger = 0
        endpoint = f"tcp://127.0.0.1:{node.bind_to_random_port('tcp://127.0.0.1')}"
        try:
            for i in range(250):
                ctx = zmq.asyncio.Context()
                client = NodeClient(endpoint, ctx=ctx)
                client.connect()
                for _ in range(i % 4):            # close at different points of the handshake
                    await asyncio.sleep(0)
                await client.aclose()
                if not _context_still_connects(ctx, endpoint):
                    _STALLED.append(ctx)
                    raise AssertionError(f"the context stalled after {i + 1} closes")
                ctx.term()
        finally:
            node.close(0)
            server_ctx.term()
    asyncio.run(body())
