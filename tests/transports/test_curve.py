"""CURVE security: only listed keys connect, and a session obeys only the key that opened it."""
import asyncio
import contextlib
import shutil

import numpy as np
import pytest
import zmq.asyncio
import zmq.auth

from sim.executor import SimExecutor
from wave_actors.core.contract import ExecutorOptions
from transports import protocol as P
from transports.client import Audio, CurveKeys, NodeClient, Refused
from wave_actors.core.timebase import Clock
from wave_actors.node.config import NodeConfig
from wave_actors.node.node import Node


@pytest.fixture
def keys(tmp_path):
    node_dir, clients, other = tmp_path / "node", tmp_path / "node" / "clients", tmp_path / "x"
    for d in (node_dir, clients, other):
        d.mkdir(parents=True, exist_ok=True)
    zmq.auth.create_certificates(node_dir, "server")
    for name in ("alice", "bob"):
        zmq.auth.create_certificates(tmp_path, name)
        shutil.copy(tmp_path / f"{name}.key", clients / f"{name}.key")
    zmq.auth.create_certificates(other, "mallory")          # never listed
    server_pub, _ = zmq.auth.load_certificate(node_dir / "server.key")

    def client_keys(path):
        pub, sec = zmq.auth.load_certificate(path)
        return CurveKeys(pub, sec, server_pub)
    return {"dir": node_dir, "alice": client_keys(tmp_path / "alice.key_secret"),
            "bob": client_keys(tmp_path / "bob.key_secret"),
            "mallory": client_keys(other / "mallory.key_secret")}


def test_curve_keys_gate_connections_and_sessions(keys):
    async def body():
        clock = Clock()
        node = Node(NodeConfig(bind="tcp://127.0.0.1:0", max_sessions=2,
                               curve_keys=str(keys["dir"])), SimExecutor(ExecutorOptions(max_sessions=2), clock=clock), clock)
        await node.start()
        try:
            alice = NodeClient(node.endpoint, identity=b"alice-1", curve=keys["alice"])
            alice.connect()
            s = await alice.open("call", sample_rate=16000, format="pcm_f32le")
            await s.send_audio(np.zeros(1280, np.float32).tobytes())

            mallory = NodeClient(node.endpoint, curve=keys["mallory"])
            mallory.connect()
            with pytest.raises(Refused) as exc:
                await mallory.open("evil", timeout=3)
            assert exc.value.reason == "unauthorized" and "CURVE" in str(exc.value)
            await mallory.aclose()

            # Bob is listed but does not own Alice's session: from his own connection it does
            # not exist, and taking over Alice's routing identity does not give it to him.
            frame = np.zeros(1280, np.float32).tobytes()
            bob = NodeClient(node.endpoint, identity=b"bob-1", curve=keys["bob"])
            bob.connect()
            await bob.send(P.pack("audio", "call", frame, seq=1))
            # Bob's connection under Alice's routing identity: it is not attached while hers
            # lives (no handover), and it receives nothing of her session.
            thief = NodeClient(node.endpoint, identity=b"alice-1", curve=keys["bob"])
            thief.connect()
            await thief.send(P.pack("audio", "call", frame, seq=2))
            await thief.send(P.pack("close", "call"))
            heard = 0
            for seq in range(1, 20):
                await s.send_audio(frame)
                with contextlib.suppress(asyncio.TimeoutError):
                    heard += isinstance(await s.next_event(0.05), Audio)
            assert [e.code for e in list(bob.orphan_errors)] == ["unknown_session"]
            assert thief.sessions == {} and not thief.orphan_errors
            assert heard > 0 and len(node.sessions) == 1          # Alice's session lives on
            # Resuming it under Bob's key fails, with or without a token.
            await bob.send(P.pack("resume", "call"))
            await bob.send(P.pack("resume", "call", token=s.token))
            await asyncio.sleep(0.3)
            assert [e.code for e in list(bob.orphan_errors)][1:] == ["unknown_session"] * 2
            for c in (alice, bob, thief):
                await c.aclose()
        finally:
            await node.drain(timeout=2)
    asyncio.run(body())


@pytest.mark.parametrize("blocked_send", [False, True], ids=["open sent", "open's send blocked"])
def test_a_late_curve_refusal_still_reads_as_a_refusal(keys, blocked_send):
    """The node's authenticator refuses the key late (as on a loaded machine), while the open
    already waits for its answer, or still waits to be sent (a socket with no pipe to the node
    blocks on send: here `immediate`, as after a refused handshake dropped the pipe): the open
    ends with Refused('unauthorized') when the refusal comes, not with NodeUnavailable or a
    caller's timeout at the open's own timeout."""
    async def body():
        ctx = zmq.asyncio.Context()
        server = ctx.socket(zmq.ROUTER)
        server.curve_server = True
        server.curve_secretkey = zmq.auth.load_certificate(keys["dir"] / "server.key_secret")[1]
        zap = ctx.socket(zmq.REP)                  # this context's ZAP handler: slow, then no
        zap.bind("inproc://zeromq.zap.01")
        port = server.bind_to_random_port("tcp://127.0.0.1")

        async def refuse_late():
            request = await zap.recv_multipart()
            await asyncio.sleep(0.5)
            await zap.send_multipart([b"1.0", request[1], b"400", b"not listed", b"", b""])
        zapper = asyncio.get_running_loop().create_task(refuse_late())
        mallory = NodeClient(f"tcp://127.0.0.1:{port}", curve=keys["mallory"])
        if blocked_send:
            mallory.sock.immediate = True
        try:
            mallory.connect()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(Refused) as exc:
                await asyncio.wait_for(mallory.open("evil", timeout=5), 5)
            assert exc.value.reason == "unauthorized"
            assert loop.time() - t0 < 4                # the refusal, not the open's timeout
            await zapper
        finally:
            zapper.cancel()
            await mallory.aclose()
            zap.close(0)
            server.close(0)
            ctx.term()
    asyncio.run(body())
