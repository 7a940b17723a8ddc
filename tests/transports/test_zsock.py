"""transports/zsock.py: a socket that sends while its receive waits gets every reply, in order,
through drained batches; a send that waits for room gets it when the peer reads; a send on a
closed socket is refused, not attempted (the twin would use freed memory); a closed socket's
reader leaves the loop and its waiters are told. The stall the kick prevents showed in the sim
bench under load and is not reproduced at this scale."""
import asyncio

import pytest
import zmq
import zmq.asyncio

from transports import zsock


async def _pair():
    ctx = zmq.asyncio.Context()
    a, b = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    a.bind("inproc://zsock-test")
    b.connect("inproc://zsock-test")
    return ctx, a, b


def test_a_socket_that_sends_through_its_twin_receives_every_reply_in_order():
    async def scenario() -> list[int]:
        ctx, a, b = await _pair()
        tx_a, tx_b = zsock.Tx(a), zsock.Tx(b)
        got: list[int] = []

        async def reader() -> None:
            async for batch in zsock.batches(tx_a):
                got.extend(int(m[0]) for m in batch)
                if len(got) == 200:
                    return

        async def echo() -> None:            # b answers each of a's messages
            async for batch in zsock.batches(tx_b):
                for m in batch:
                    tx_b.send(m)

        r, e = asyncio.create_task(reader()), asyncio.create_task(echo())
        for i in range(200):                 # a sends while its own receive is pending
            tx_a.send([str(i).encode()])
            if i % 7 == 0:
                await asyncio.sleep(0)
        await asyncio.wait_for(r, 5.0)
        e.cancel()
        tx_a.close(0)
        tx_b.close(0)
        ctx.term()
        return got
    assert asyncio.run(scenario()) == list(range(200))


def test_a_send_on_a_closed_socket_is_refused():
    async def scenario() -> None:
        ctx, a, b = await _pair()
        tx = zsock.Tx(a)
        a.close(0)
        with pytest.raises(zmq.ZMQError) as exc:
            tx.send([b"late"])
        assert exc.value.errno == zmq.ENOTSOCK
        b.close(0)
        ctx.term()
    asyncio.run(scenario())


def test_a_send_waits_for_room_and_goes_when_the_peer_reads():
    """Catches a waiting send that never wakes: the descriptor's edge is consumed by the failed
    send itself, and only a look at the events after the peer's reads finds the room."""
    async def scenario() -> list[bytes]:
        ctx, a, b = await _pair()
        a.setsockopt(zmq.SNDHWM, 1)
        b.setsockopt(zmq.RCVHWM, 1)
        tx_a, tx_b = zsock.Tx(a), zsock.Tx(b)
        sent = 0
        while True:                          # fill the pipe until a send finds no room
            try:
                tx_a.send([b"%d" % sent])
                sent += 1
            except zmq.Again:
                break
        waiting = asyncio.create_task(tx_a.send_waiting([b"last"]))
        await asyncio.sleep(0.05)
        assert not waiting.done()            # no room yet: it waits, it does not fail
        got: list[bytes] = []
        async for batch in zsock.batches(tx_b):
            got += [m[0] for m in batch]
            if got[-1] == b"last":
                break
        await asyncio.wait_for(waiting, 5.0)
        tx_a.close(0)
        tx_b.close(0)
        ctx.term()
        return got
    got = asyncio.run(scenario())
    assert got[-1] == b"last" and got[:-1] == [b"%d" % i for i in range(len(got) - 1)]


def test_closing_through_tx_takes_the_reader_off_the_loop_and_fails_its_waiters():
    """Catches a reader left on the loop for a closed socket's descriptor (the number is
    reused by the next socket, whose reader could then not be added) and a wait that never
    ends when its socket closes."""
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        ctx, a, b = await _pair()
        tx = zsock.Tx(a)
        waiting = asyncio.create_task(tx.wait(zsock.POLLIN))
        await asyncio.sleep(0.01)
        fd = a.FD
        tx.close(0)
        with pytest.raises(zmq.ZMQError) as exc:
            await asyncio.wait_for(waiting, 5.0)
        assert exc.value.errno == zmq.ENOTSOCK
        assert not loop.remove_reader(fd)    # nothing was left there
        b.close(0)
        ctx.term()
    asyncio.run(scenario())
