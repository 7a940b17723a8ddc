"""Nothing one client does reaches another's call: size limits, liveness by heartbeats, sessions
bound to their connection (resume tokens), per-session idle, drain edges, counts in frames, flood
limits per sender. Real node (sim executor), real TCP, real ZMQ clients."""
import asyncio
import contextlib

import msgpack
import pytest
import zmq
import zmq.asyncio

from transports import protocol as P
from transports.client import Audio, Closed, Error, NodeClient, Refused
from wave_actors.node.flood import FloodPolicy
from tests.tcpkit import FRAME, client_of, node_on_tcp, raw_dealer, reply, stream

async def audio_within(s, seconds):
    """Audio events the session got in `seconds`, and whether it was closed meanwhile."""
    loop = asyncio.get_running_loop()
    end, n = loop.time() + seconds, 0
    with contextlib.suppress(asyncio.TimeoutError):
        while True:
            ev = await s.next_event(max(0.01, end - loop.time()))
            n += isinstance(ev, Audio)
            if isinstance(ev, Closed):
                return n, True
    return n, False


async def listen(sock, seconds):
    """Every message a raw socket receives in `seconds`, as headers."""
    got = []
    with contextlib.suppress(asyncio.TimeoutError):
        while True:
            h, _ = await reply(sock, timeout=seconds)
            got.append(h)
    return got


@pytest.mark.slow
def test_an_oversized_message_gets_too_large_and_its_connection_lives_on():
    """Bug: a frame over the protocol limit made ZMQ drop the connection (MAXMSGSIZE), and the
    node ended every session of it with no `too_large` and no `closed`."""
    async def body():
        async with node_on_tcp() as node, client_of(node) as c:
            s = await c.open("big")
            other = await c.open("bystander")
            await stream(s, 4)
            await c.send(P.pack("audio", "big", b"\0" * (P.MAX_PAYLOAD_BYTES + 4096), seq=99))
            errors = []
            while not errors:
                ev = await s.next_event(5)
                if isinstance(ev, Error):
                    errors.append(ev.code)
            assert errors == [P.TOO_LARGE]
            await asyncio.gather(stream(s, 10), stream(other, 10))
            assert (await audio_within(s, 1.0))[0] > 0
            assert (await audio_within(other, 0.5))[0] > 0
            assert len(node.sessions) == 2 and node.bindings.detached == 0
            await s.close()
            await other.close()
    asyncio.run(body())


@pytest.mark.slow
def test_a_connection_under_a_live_clients_identity_receives_nothing():
    """Bug: with ROUTER_HANDOVER, a second connection using the victim's routing identity took
    over its output (42 audio and 17 text messages in 3 s) and the victim went deaf."""
    async def body():
        async with node_on_tcp() as node, client_of(node, identity=b"victim") as victim:
            s = await victim.open("call")
            feeding = asyncio.create_task(stream(s, 150))
            thief = zmq.asyncio.Context.instance().socket(zmq.DEALER)
            thief.setsockopt(zmq.LINGER, 0)
            thief.setsockopt(zmq.ROUTING_ID, b"victim")
            thief.connect(node.endpoint)
            await thief.send_multipart(P.pack("ping", nonce="x"))
            stolen = await listen(thief, 1.5)
            heard, closed = await audio_within(s, 1.0)
            feeding.cancel()
            assert [h for h in stolen if h.get("session") == "call"] == []
            assert heard > 0 and not closed
            thief.close(0)
            await s.close()
    asyncio.run(body())


def test_a_vanished_clients_identity_gives_a_newcomer_nothing_and_the_token_resumes():
    """Bug: routing by identity alone; a newcomer that takes the identity of a client whose
    connection is gone must get nothing of its sessions, while the owner resumes them by token
    from a new connection and hears its audio again."""
    async def body():
        async with node_on_tcp(heartbeat_s=0.5, resume_grace_s=3.0) as node:
            owner = NodeClient(node.endpoint, identity=b"owner")
            owner.connect()
            s = await owner.open("call")
            await stream(s, 5)
            token = s.token
            await owner.aclose()                        # the connection drops
            intruder = zmq.asyncio.Context.instance().socket(zmq.DEALER)
            intruder.setsockopt(zmq.LINGER, 0)
            intruder.setsockopt(zmq.ROUTING_ID, b"owner")
            intruder.connect(node.endpoint)
            await intruder.send_multipart(P.pack("audio", "call", FRAME, seq=5))
            await intruder.send_multipart(P.pack("resume", "call", token="0" * 32))
            got = await listen(intruder, 1.0)
            assert not [h for h in got if h["type"] in ("audio", "text", "resumed", "closed")]
            assert {h.get("code") for h in got} <= {P.DETACHED, P.UNKNOWN_SESSION}
            intruder.close(0)
            back = await raw_dealer(node)               # the owner, on a new connection
            await back.send_multipart(P.pack("resume", "call", token=token))
            ok = None
            while ok is None:
                h, _ = await reply(back)
                ok = h if h["type"] == "resumed" else None
            back.close(0)
            assert ok["seq"] == 5 and node.bindings.resumed == 1
            assert len(node.sessions) == 1
    asyncio.run(body())


def test_nodeclient_resumes_by_itself_when_the_node_says_detached():
    """A session detached by a silent spell resumes on the client's next send, and the audio
    the node did not get is sent again from the replay buffer."""
    async def body():
        async with node_on_tcp(heartbeat_s=0.2, heartbeat_liveness=2, resume_grace_s=5.0) as node, \
                client_of(node) as c:
            s = await c.open("call")
            await stream(s, 3)
            route = next(iter(node.routes.values()))
            node.bindings.detach(route, node.clock.now())   # as if its heartbeats had stopped
            await stream(s, 10)
            for _ in range(100):
                if s.resumes:
                    break
                await asyncio.sleep(0.05)
            assert s.resumes == 1 and route.detached_at is None
            await stream(s, 5)
            closed = await s.close()
            st = closed.stats
            assert st["frames_in"] + st["dropped_in"] >= 18, st    # the refused ones were re-sent
    asyncio.run(body())


@pytest.mark.slow
def test_idle_is_judged_per_session():
    """Bug: idle detection looked at the connection, so a session with no input was never
    reaped while another session on the same connection was active."""
    async def body():
        async with node_on_tcp(idle_timeout_s=0.6) as node:
            sock = await raw_dealer(node)
            for sid in ("talking", "silent"):
                await sock.send_multipart(P.pack("open", sid, sample_rate=16000, format="pcm_f32le"))
            opened = 0
            while opened < 2:
                h, _ = await reply(sock)
                opened += h["type"] == "opened"
            closed = []
            for seq in range(40):                          # 1.6 s of audio for one session only
                await sock.send_multipart(P.pack("audio", "talking", FRAME, seq=seq))
                with contextlib.suppress(asyncio.TimeoutError):
                    while True:
                        h, _ = await reply(sock, timeout=0.04)
                        if h["type"] == "closed":
                            closed.append(h["session"])
            assert closed == ["silent"]
            assert [k[1] for k in node.sessions] == ["talking"]
            sock.close(0)
    asyncio.run(body())


@pytest.mark.parametrize("v", [True, 1.0, "1", 2])
def test_version_must_be_the_integer_1(v):
    """Bug: `v=true` and `v=1.0` were accepted as version 1 (Python's True == 1.0 == 1)."""
    with pytest.raises(P.ProtocolError) as exc:
        P.parse([msgpack.packb({"v": v, "type": "ping"})])
    assert exc.value.code == P.BAD_VERSION


def test_duplicates_are_counted_in_frames_not_messages():
    """Bug: `closed.stats.dropped` counted duplicates per message (133 counted against 125.5
    frames of audio): 40 ms messages sent twice must count half a frame each."""
    async def body():
        async with node_on_tcp() as node, client_of(node) as c:
            s = await c.open("dup")
            half = FRAME[: len(FRAME) // 2]
            for seq in range(20):
                await s.send_audio(half, seq=seq)
                await s.send_audio(half, seq=seq)        # its duplicate
                await asyncio.sleep(0.02)
            await asyncio.sleep(1.5)                       # every real frame heard
            st = (await s.close()).stats
            assert st["frames_in"] == 10, st
            assert st["dropped_in"] == 10, st              # 20 × 40 ms duplicated = 10 frames
    asyncio.run(body())


@pytest.mark.slow
def test_flood_limit_is_per_sender_not_per_chosen_identity():
    """Bug: the flood limit was keyed by the routing identity a client picks, so 36 fresh
    identities sent 7,366 messages unlimited. Here 30 identities from one address share one
    budget, and the notice counts what was dropped."""
    async def body():
        async with node_on_tcp(flood=FloodPolicy(rate=20.0, burst=40.0)) as node:
            socks = [await raw_dealer(node) for _ in range(30)]
            for i in range(10):
                for sock in socks:
                    await sock.send_multipart(P.pack("ping", nonce=i))
            notices = []
            for sock in socks:
                for h in await listen(sock, 0.2):
                    if h.get("code") == P.OVERLOADED:
                        notices.append(h["message"])
            assert node.counters.flood_drops >= 300 - 40 - 20
            assert notices and all("dropped since the last notice" in m for m in notices)
            for sock in socks:
                sock.close(0)
    asyncio.run(body())


def test_drain_refuses_opens_until_the_socket_closes_and_answers_those_in_flight():
    """Bug: an `open` in flight at SIGTERM got no answer in 2 of 5 runs, and one sent 0.3 s
    after SIGTERM was never answered (the socket was already closed)."""
    async def body():
        async with node_on_tcp(max_sessions=2, drain_grace_s=1.0) as node, client_of(node) as c:
            in_flight = asyncio.create_task(c.open("racing", timeout=5))
            await asyncio.sleep(0)
            drained = asyncio.create_task(node.drain(timeout=3))
            await asyncio.sleep(0.3)
            late = asyncio.create_task(c.open("late", timeout=5))
            results = await asyncio.gather(in_flight, late, return_exceptions=True)
            await drained
            for r in results:
                assert isinstance(r, Refused) and r.reason == "draining", r
    asyncio.run(body())


@pytest.mark.slow
def test_a_network_blip_detaches_and_resumes_every_session_of_the_connection():
    """Bug: a relay that reset the connection and refused reconnects for 0.5 s ended both
    sessions at once, with no `closed`. Now both resume by themselves and, at their close, get
    `closed` with every frame they sent heard or counted."""
    from chaos.relay import Relay

    async def body():
        async with node_on_tcp(heartbeat_s=0.25, resume_grace_s=5.0) as node:
            port = int(node.endpoint.rsplit(":", 1)[1])
            relay = Relay("127.0.0.1", port)
            rport = await relay.start()
            c = NodeClient(f"tcp://127.0.0.1:{rport}")
            c.sock.setsockopt(zmq.RECONNECT_IVL, 50)
            c.connect()
            try:
                a, b = await c.open("a"), await c.open("b")
                await asyncio.gather(stream(a, 10), stream(b, 10))
                relay.refuse_for(0.5)
                assert relay.reset() >= 1
                await asyncio.gather(stream(a, 40, 0.03), stream(b, 40, 0.03))
                for _ in range(100):
                    if a.resumes and b.resumes:
                        break
                    await asyncio.sleep(0.05)
                assert a.resumes >= 1 and b.resumes >= 1, (a.resumes, b.resumes)
                assert (await audio_within(a, 0.6))[0] > 0
                assert (await audio_within(b, 0.6))[0] > 0
                assert len(node.sessions) == 2 and node.bindings.detached >= 2
                for s in (a, b):
                    st = (await s.close()).stats
                    # 50 frames sent; the ones lost in the reset were sent again (replay), so
                    # every one was heard or is counted.
                    assert st["frames_in"] + st["dropped_in"] >= 50, st
            finally:
                await c.aclose()
                await relay.close()
    asyncio.run(body())


def test_audio_sent_right_before_close_is_heard_or_counted():
    """Bug: a frame in flight at a close was once lost without a count (audio queued behind the
    close in the session's mailbox was discarded when the actor stopped)."""
    async def body():
        async with node_on_tcp() as node:
            sock = await raw_dealer(node)
            for run in range(5):
                sid = f"s{run}"
                await sock.send_multipart(P.pack("open", sid, sample_rate=16000,
                                                 format="pcm_f32le"))
                h, _ = await reply(sock)
                assert h["type"] == "opened"
                for seq in range(10):
                    await sock.send_multipart(P.pack("audio", sid, FRAME, seq=seq))
                await sock.send_multipart(P.pack("close", sid))
                while True:
                    h, _ = await reply(sock)
                    if h["type"] == "closed":
                        break
                st = h["stats"]
                assert st["frames_in"] + st["dropped_in"] == 10, st
            sock.close(0)
    asyncio.run(body())


def test_a_close_right_after_open_cancels_the_start_and_frees_the_slot():
    """Bug: a `close` sent right after `open` got `unknown_session` and the session opened
    anyway (10 of 10), holding its slot for nobody."""
    async def body():
        async with node_on_tcp(max_sessions=1) as node:
            sock = await raw_dealer(node)
            for i in range(10):
                await sock.send_multipart(P.pack("open", f"s{i}", sample_rate=16000,
                                                 format="pcm_f32le"))
                await sock.send_multipart(P.pack("close", f"s{i}"))
                h, _ = await reply(sock, timeout=5)
                if h["type"] == "opened":          # answered before the close was read
                    h, _ = await reply(sock, timeout=5)
                assert (h["type"], h["session"]) == ("closed", f"s{i}"), h
            assert not node.routes and node.clock_actor.slots.table.free_slots == 1
            async with client_of(node) as c:                  # the one slot is free
                await (await c.open("after")).close()
            sock.close(0)
    asyncio.run(body())


@pytest.mark.slow
def test_failed_sends_do_not_detach_only_missed_heartbeats_do():
    """A peer is dead after several missed heartbeats, never after one failed send (libzmq also
    answers EHOSTUNREACH for a live peer whose full pipe is draining)."""
    async def body():
        async with node_on_tcp(heartbeat_s=0.5, resume_grace_s=5.0) as node:
            c = NodeClient(node.endpoint)
            c.connect()
            s = await c.open("call")
            await stream(s, 3)
            await c.aclose()                         # gone: the node's sends now fail
            route = next(iter(node.routes.values()))
            await asyncio.sleep(0.8)                 # 5 beats of outputs to nobody
            assert route.detached_at is None
            await asyncio.sleep(1.2)                 # past 3 heartbeats of silence
            assert route.detached_at is not None and len(node.sessions) == 1
    asyncio.run(body())


def test_a_quiet_client_pings_at_the_nodes_heartbeat_from_the_open_on():
    """Bug: the client learned the node's heartbeat from `opened` but its pinger was already
    asleep for the default second, so a node with a shorter heartbeat detached a session that
    was opened and then quiet."""
    async def body():
        async with node_on_tcp(heartbeat_s=0.2, resume_grace_s=5.0) as node, \
                client_of(node) as c:
            s = await c.open("quiet")
            route = next(iter(node.routes.values()))
            await asyncio.sleep(1.2)                  # no audio: only the pinger speaks
            assert route.detached_at is None and node.bindings.detached == 0
            assert s.resumes == 0
            await s.close()
    asyncio.run(body())


def test_a_close_the_node_answers_detached_is_sent_again_after_the_resume():
    """Bug: a `close` that reached the node while its session was detached was answered
    `detached`; the client resumed but never asked again, and waited for `closed` forever."""
    async def body():
        async with node_on_tcp(heartbeat_s=0.5, resume_grace_s=5.0) as node, \
                client_of(node) as c:
            s = await c.open("call")
            await stream(s, 3)
            route = next(iter(node.routes.values()))
            node.bindings.detach(route, node.clock.now())   # as if its heartbeats had stopped
            closed = await s.close(timeout=3.0)
            assert s.resumes == 1 and closed.stats["frames_in"] + closed.stats["dropped_in"] >= 3
            assert not node.sessions
    asyncio.run(body())
