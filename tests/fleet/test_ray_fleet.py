"""The fleet on a local Ray cluster (GPUs are Ray resource labels here): sim nodes as real
node processes, each behind a node actor, one directory actor, calls opened through it."""
from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow          # a local Ray cluster and node processes each

from transports.client_events import Closed, Error, Refused     # noqa: E402
import json                                                    # noqa: E402

from websockets.asyncio.client import connect                  # noqa: E402

from tests.transports.realtimekit import until               # noqa: E402
from transports.realtime.server import Bridge, BridgeConfig    # noqa: E402
from transports.fleet_client import FleetClient            # noqa: E402
from wave_actors.fleet.ray_fleet import Fleet                 # noqa: E402

SLOTS = 3
NODE_ARGS = ["--backend", "sim", "--max-sessions", str(SLOTS), "--workers", "0"]


@pytest.fixture(scope="module")
def fleet():
    ray.init(num_cpus=2, num_gpus=3, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    f = Fleet.start(3, NODE_ARGS)
    # a loaded 2-core runner can starve a node's actor for seconds: only the test of a stuck
    # node sets the limit low, for its own part
    f.silent_loss_s = 60.0
    try:
        facts = f.ready()
        assert [x["slots"] for x in facts] == [SLOTS] * 3
        f.watch()
        yield f
    finally:
        f.close()
        ray.shutdown()


def stats(f) -> dict:
    return ray.get(f.directory.stats.remote())


# Generous on purpose: on a loaded 2-core runner a restarted node process takes tens of seconds
# to import and build; the tests judge what happens, not how fast.
PATIENCE_S = 120.0


async def eventually(check, patience: float = PATIENCE_S, every: float = 0.1) -> bool:
    deadline = time.monotonic() + patience
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(every)
    return True


async def all_alive(f) -> None:
    """Each test starts from an idle fleet: every node alive, answering and holding no call (a
    node killed by an earlier test may still be coming back; calls one left end idle)."""
    def ready(n: dict) -> bool:
        return n.get("alive", False) and not n.get("quiet", True) and n.get("used", 1) == 0
    assert await eventually(lambda: all(ready(stats(f)["nodes"].get(n, {})) for n in f.nodes))


def test_the_realtime_bridge_places_its_calls_through_the_fleet(fleet):
    """`--fleet`: each WebSocket call is a session on the node the directory picked, and the
    directory hears its close (the client's watch), freeing the slot."""
    async def main():
        bridge = await Bridge(BridgeConfig(fleet="auto", port=0)).start()
        try:
            sockets = [await connect(f"ws://127.0.0.1:{bridge.port}/v1/realtime")
                       for _ in range(2)]
            for ws in sockets:
                await until(ws, "session.created")
                await ws.send(json.dumps({"type": "session.update", "session": {}}))
                await until(ws, "session.updated", 10)
            s = stats(fleet)
            assert s["sessions"] == 2 and s["placements"] >= 2
            assert {n for n, x in s["nodes"].items() if x["used"]} <= set(fleet.names)
            for ws in sockets:
                await ws.close()
            assert await eventually(lambda: stats(fleet)["sessions"] == 0)
        finally:
            await bridge.stop()
    asyncio.run(main())


def test_the_fleet_takes_every_nodes_slots_then_refuses_and_drains_dropping_none(fleet):
    async def main():
        calls = FleetClient(fleet.directory)
        opened = [await calls.open(f"call-{i}") for i in range(3 * SLOTS)]
        per_node = {n: list(calls.node_of.values()).count(n) for n in fleet.names}
        assert per_node == {n: SLOTS for n in fleet.names}            # 3 × one node's slots
        with pytest.raises(Refused) as full:
            await calls.open("one-too-many")
        assert full.value.reason == "capacity"
        # drain node1 while its calls are live: it takes no new call; they end as they will
        drained = [c for c in opened if calls.node_of[c.id] == "node1"]
        drain = asyncio.get_running_loop().run_in_executor(None, fleet.drain, "node1", 30.0)
        await asyncio.sleep(0.5)
        for c in drained:
            await calls.close(c)
        assert await drain == 0                                     # no call dropped
        assert "node1" not in stats(fleet)["nodes"]
        for c in opened:
            if c not in drained:
                await calls.close(c)
        await calls.aclose()
        s = stats(fleet)
        assert s["sessions"] == 0 and s["refusals"] == {"capacity": 1}
    asyncio.run(main())


def test_a_killed_node_leaves_placement_at_once_and_comes_back_empty(fleet):
    async def main():
        calls = FleetClient(fleet.directory)
        on_node0, opened = [], []
        for i in range(2 * SLOTS):
            c = await calls.open(f"k-{i}")
            opened.append(c)
            if calls.node_of[c.id] == "node0":
                on_node0.append(c.id)
        assert on_node0
        before = ray.get(fleet.nodes["node0"].info.remote())
        t0 = time.time()
        ray.kill(fleet.nodes["node0"], no_restart=False)
        while not any(n == "node0" and at >= t0 for n, at in fleet.lost_events):
            await asyncio.sleep(0.05)
        s = stats(fleet)
        assert all(ray.get(fleet.directory.locate.remote(x)) is None for x in on_node0)
        assert s["nodes"]["node0"]["used"] == 0
        # its callers hear `error node_lost`, then `closed` (how soon: `bench/fleet_loss.py`)
        lost = [c for c in opened if c.id in on_node0]
        for c in lost:
            first = await c.next_event(timeout=10.0)
            while not isinstance(first, Error):
                first = await c.next_event(timeout=10.0)
            assert first.code == "node_lost"
            assert isinstance(await c.next_event(timeout=10.0), Closed)
        assert calls.lost == len(on_node0)
        others = [c for c in opened if c.id not in on_node0]
        assert others and all(c.closed is None for c in others)      # only its calls ended
        for c in others:
            assert (await calls.close(c)).stats.get("reason") != "node_lost"
        # Ray restarts the actor: a fresh node joins again under its name
        def back():
            info = stats(fleet)["nodes"]["node0"]
            return info["incarnation"] > before["incarnation"] and info["alive"]
        assert await eventually(back)
        assert stats(fleet)["nodes"]["node0"]["incarnation"] == before["incarnation"] + 1
        await calls.aclose()
    asyncio.run(main())


def test_the_watch_reads_every_node_and_reports_its_headroom(fleet):
    """Each watch reads the nodes' own registries (beats run, late beats) and hands the
    directory each node's beat headroom, which placement weighs after free slots."""
    async def main():
        await all_alive(fleet)
        calls = FleetClient(fleet.directory)
        opened = [await calls.open(f"h-{i}") for i in range(len(fleet.nodes))]
        assert sorted(calls.node_of.values()) == sorted(fleet.nodes)    # a beat on each
        def read():
            nodes = stats(fleet)["nodes"]
            return all(fleet.readings.get(n) and fleet.readings[n].beats > 0 and
                       nodes[n]["headroom_ms"] > 0 for n in fleet.nodes)
        await eventually(read, every=0.2)
        for name in fleet.nodes:
            assert fleet.readings[name].beats > 0
            assert 0 < stats(fleet)["nodes"][name]["headroom_ms"] <= 160
        assert fleet.totals.beats >= sum(r.beats for r in fleet.readings.values())
        for c in opened:
            await calls.close(c)
        await calls.aclose()
    asyncio.run(main())


def test_a_slow_node_keeps_its_calls_and_a_stuck_one_is_restarted(fleet):
    """Bug it catches: one reading slower than the watch period declared a healthy node lost,
    ending its calls, and it stayed out of placement for good (its actor never restarted). A
    node stopped for a few watch periods (a loaded host) keeps its calls and only leaves
    placement meanwhile; one silent past `silent_loss_s` is lost and restarted, and comes
    back empty."""
    async def main():
        await all_alive(fleet)
        calls = FleetClient(fleet.directory)
        name, opened = sorted(fleet.nodes)[0], []
        while not any(calls.node_of[c.id] == name for c in opened):
            opened.append(await calls.open(f"slow-{len(opened)}"))
        held = opened[-1]
        before = ray.get(fleet.nodes[name].info.remote())
        t0, patience = time.time(), fleet.silent_loss_s
        fleet.silent_loss_s = 60.0          # this part judges slow against lost, not the limit
        try:
            os.kill(before["node_pid"], signal.SIGSTOP)
            assert await eventually(lambda: stats(fleet)["nodes"][name]["quiet"])
            newcomer = await calls.open("while-quiet")
            assert calls.node_of[newcomer.id] != name               # out of placement
            os.kill(before["node_pid"], signal.SIGCONT)
            assert await eventually(lambda: not stats(fleet)["nodes"][name]["quiet"])
            assert held.closed is None and not any(n == name and at >= t0
                                                   for n, at in fleet.lost_events)
            assert (await calls.close(held)).stats.get("reason") != "node_lost"
            stuck = []
            while not any(calls.node_of[c.id] == name for c in stuck):
                stuck.append(await calls.open(f"stuck-{len(stuck)}"))
            held = stuck[-1]
            fleet.silent_loss_s = 2.0
            t1 = time.time()
            os.kill(before["node_pid"], signal.SIGSTOP)
            assert await eventually(lambda: any(n == name and at >= t1
                                                for n, at in fleet.lost_events))
            first = await held.next_event(timeout=10.0)
            while not isinstance(first, Error):
                first = await held.next_event(timeout=10.0)
            assert first.code == "node_lost"
            def back():
                info = stats(fleet)["nodes"][name]
                return info["incarnation"] > before["incarnation"] and info["alive"]
            assert await eventually(back)
            assert stats(fleet)["nodes"][name]["used"] == 0
        finally:
            fleet.silent_loss_s = patience
            try:
                os.kill(before["node_pid"], signal.SIGCONT)
            except ProcessLookupError:
                pass
        for c in opened + stuck + [newcomer]:
            if c.closed is None:
                await calls.close(c)
        await calls.aclose()
    asyncio.run(main())


def test_a_restarted_directory_learns_the_live_calls_from_the_nodes(fleet):
    """Bug it catches: the directory's death lost every placement: the bridges then ended
    their live calls as lost, and placement took the nodes for empty. Ray restarts it; the
    nodes say again what they hold; no call ends and every slot stays counted. A drain asked
    before the restart holds after it (it was forgotten: the node took new calls again)."""
    async def main():
        await all_alive(fleet)
        calls = FleetClient(fleet.directory)
        opened = []
        try:
            await restarted_with_calls(calls, opened)
        finally:                    # a failure here leaves the module's fleet as it found it
            for c in opened:
                if c.closed is None:
                    await calls.close(c)
            await calls.aclose()
            for name, v in stats(fleet)["nodes"].items():
                if v["draining"]:
                    ray.get(fleet.directory.undrain.remote(name))

    async def restarted_with_calls(calls, opened):
        opened += [await calls.open(f"r-{i}") for i in range(len(fleet.nodes))]
        assert await eventually(lambda: stats(fleet)["unconfirmed"] == 0)
        where = dict(calls.node_of)
        drained = where[opened[0].id]           # a call stays on it: drained, not retired
        ray.get(fleet.directory.drain.remote(drained))
        assert await eventually(                # the watch saw the drain before the restart
            lambda: fleet.last_stats.get("nodes", {}).get(drained, {}).get("draining"))
        await asyncio.sleep(0.2)
        ray.kill(fleet.directory, no_restart=False)
        # The kill is asynchronous: the dying directory may still answer a first look.
        assert await eventually(lambda: (s := stats(fleet))["restarted"] and not s["restoring"])
        await asyncio.sleep(1.0)                        # the bridge's watch looks, four times
        s = stats(fleet)
        assert s["sessions"] == len(opened) and calls.lost == 0
        assert all(c.closed is None for c in opened)
        assert {c.id: ray.get(fleet.directory.locate.remote(c.id))["node"]
                for c in opened} == where
        assert sum(n["used"] for n in s["nodes"].values()) == len(opened)
        assert [n for n, v in s["nodes"].items() if v["draining"]] == [drained]
        opened.append(await calls.open("after-restore"))         # placement goes on
        assert calls.node_of[opened[-1].id] != drained
        ray.get(fleet.directory.undrain.remote(drained))
        for c in opened:
            await calls.close(c)
        assert stats(fleet)["sessions"] == 0
    asyncio.run(main())


def test_a_call_is_taken_over_through_the_fleet_by_another_bridge(fleet):
    """`resume` finds a call on its node: a bridge that died leaves its calls live for the
    resume grace, and another one (or the same one restarted) takes a call over by its token
    through the directory, on the node that holds it. A wrong token gets nothing."""
    async def main():
        await all_alive(fleet)
        gone = FleetClient(fleet.directory)
        call = await gone.open("taken-over")
        node, token = gone.node_of[call.id], call.token
        await gone.aclose()
        bridge = FleetClient(fleet.directory)
        with pytest.raises(Refused):
            await bridge.attach(call.id, "0" * 32, timeout=3.0)
        with pytest.raises(Refused):
            await bridge.attach("no-such-call", token)
        taken = await bridge.attach(call.id, token)
        assert taken.closed is None and bridge.node_of[call.id] == node
        assert stats(fleet)["sessions"] == 1
        await bridge.close(taken)
        assert stats(fleet)["sessions"] == 0
        await bridge.aclose()
    asyncio.run(main())


def test_a_drain_asked_of_the_directory_is_finished_by_the_watch(fleet):
    """`python -m wave_actors.fleet drain NODE` only tells the directory: the entry point's
    watch stops the node once its last call has ended, not before."""
    async def main():
        await all_alive(fleet)
        calls = FleetClient(fleet.directory)
        name, opened = fleet.names[-1], []
        while not any(calls.node_of[c.id] == name for c in opened):
            opened.append(await calls.open(f"d-{len(opened)}"))
        held = opened[-1]
        ray.get(fleet.directory.drain.remote(name))
        await asyncio.sleep(1.5)                                    # three watch periods
        assert name in fleet.nodes and held.closed is None          # a live call holds it
        await calls.close(held)
        await eventually(lambda: name not in fleet.nodes and name not in stats(fleet)["nodes"])
        assert name not in fleet.nodes and name not in stats(fleet)["nodes"]
        for c in opened[:-1]:
            await calls.close(c)
        await calls.aclose()
    asyncio.run(main())


def test_a_burst_through_one_bridge_shares_messages_and_spreads(fleet):
    """Placements asked while one is in flight go in one `place_many`: a burst of opens costs
    the directory fewer messages than calls and still spreads evenly; an open cancelled while
    its placement is in flight gives its slot back."""
    async def main():
        await all_alive(fleet)
        calls = FleetClient(fleet.directory)
        n = len(fleet.nodes) * SLOTS
        placed = await asyncio.gather(*(calls.place(f"b-{i}") for i in range(n)))
        assert calls.place_messages < n
        per_node = {x: sum(p["node"] == x for p in placed) for x in fleet.nodes}
        assert set(per_node.values()) == {SLOTS}                    # every slot, evenly
        ray.get(fleet.directory.closed_many.remote([p["session"] for p in placed]))
        assert stats(fleet)["sessions"] == 0
        task = asyncio.ensure_future(calls.place("cancelled"))
        await asyncio.sleep(0)                                      # its message is in flight
        task.cancel()
        await eventually(lambda: ray.get(fleet.directory.locate.remote("cancelled")) is None)
        assert ray.get(fleet.directory.locate.remote("cancelled")) is None
        assert stats(fleet)["sessions"] == 0
        await calls.aclose()
    asyncio.run(main())


def test_calls_whose_bridge_died_free_their_slots_from_the_nodes_own_word(fleet):
    """Bug it catches: closes reached the directory only from the bridge that placed the call,
    so a bridge that died with live calls left their slots held for good (the fleet filling
    with calls no node serves). The node closes them once their resume grace is over, says so
    on its `--report-sessions` lines, and the entry point's watch frees them."""
    async def main():
        await all_alive(fleet)
        calls = FleetClient(fleet.directory)
        held = [await calls.open(f"orphan-{i}") for i in range(len(fleet.nodes))]
        assert stats(fleet)["sessions"] == len(held)
        # each node says it opened its call: no placement is left to expire as unconfirmed
        assert await eventually(lambda: stats(fleet)["unconfirmed"] == 0)
        closes = stats(fleet)["closes"]
        await calls.aclose()                # the bridge gone: nobody will close these calls
        assert await eventually(lambda: stats(fleet)["sessions"] == 0)
        assert stats(fleet)["closes"] == closes + len(held)
        assert all(ray.get(fleet.directory.locate.remote(c.id)) is None for c in held)
    asyncio.run(main())



def test_a_node_killed_before_a_watch_first_read_it_comes_back_into_placement(fleet):
    """Catches a loss reported without the incarnation that died (a watch yet to read the node):
    it was taken for the restarted node's, which then stayed out of placement for good."""
    async def main():
        await all_alive(fleet)
        name = sorted(fleet.nodes)[-1]          # one no earlier test drained away
        before = stats(fleet)["nodes"][name]["incarnation"]
        second = Fleet.attach(fleet.namespace)      # an entry point's watch, just started
        second.watch()
        try:
            ray.kill(fleet.nodes[name], no_restart=False)     # before its first reading
            assert await eventually(lambda: stats(fleet)["nodes"][name]["incarnation"] > before)
            await asyncio.sleep(3.0)    # both watches' word on the loss, however late, is in
            n = stats(fleet)["nodes"][name]
            assert n["alive"] and n["incarnation"] == before + 1
        finally:
            second.stop_watch()
    asyncio.run(main())
