"""The fleet's directory and placement: slots counted at placement, drains and lost nodes, and
a property test over random sequences of fleet events."""
from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings, strategies as st

from wave_actors.fleet.directory import Directory, FleetFull, UnknownNode
from wave_actors.fleet.placement import POLICIES, NodeLoad, OpenNodes, policy


def fleet(slots=(2, 2, 2), placement="most_free") -> Directory:
    d = Directory(placement, seed=1)
    for i, n in enumerate(slots):
        d.join(f"n{i}", f"tcp://n{i}:5555", n)
    return d


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_burst_between_reports_fills_every_slot_and_no_more(name):
    """Bug it catches: a slot counted only at the node's next load report (a burst then lands
    on whichever node last reported room, past its slots)."""
    d = fleet((3, 3, 3), name)
    placed = [d.place() for _ in range(9)]
    per_node = {n: sum(p.node == n for p in placed) for n in ("n0", "n1", "n2")}
    assert per_node == {"n0": 3, "n1": 3, "n2": 3}
    with pytest.raises(FleetFull) as full:
        d.place()
    assert full.value.reason == "capacity" and d.counters.refusals == {"capacity": 1}


def test_most_free_spreads_a_burst_evenly():
    d = fleet((10, 10, 10, 10))
    nodes = [d.place().node for _ in range(8)]
    assert sorted(nodes.count(n) for n in set(nodes)) == [2, 2, 2, 2]


def test_a_call_stays_on_its_node_and_a_retried_placement_is_not_a_second_call():
    d = fleet()
    p = d.place("call-1")
    assert d.place("call-1") == p and d.counters.placements == 1
    assert d.locate("call-1") == p
    assert d.closed("call-1") and not d.closed("call-1")       # closed once
    assert d.locate("call-1") is None


def test_a_draining_node_takes_no_call_and_keeps_its_live_ones():
    d = fleet((2, 2))
    a = d.place("a")
    assert d.drain(a.node) == 1
    others = {d.place(f"x{i}").node for i in range(2)}
    assert others == {"n1" if a.node == "n0" else "n0"}
    with pytest.raises(FleetFull):
        d.place("y")
    assert d.locate("a") == a
    d.closed("a")
    assert d.leave(a.node) == []


def test_only_draining_nodes_is_no_nodes_not_capacity():
    d = fleet((1,))
    d.drain("n0")
    with pytest.raises(FleetFull) as full:
        d.place()
    assert full.value.reason == "no_nodes"


def test_a_lost_node_hands_back_its_sessions_and_a_restart_starts_empty():
    d = fleet((2, 2), "random")
    placed = [d.place(f"c{i}") for i in range(4)]
    on_n0 = sorted(p.session for p in placed if p.node == "n0")
    assert d.lost("n0") == on_n0
    assert all(d.locate(s) is None for s in on_n0)
    with pytest.raises(FleetFull):                   # n1 is full, and a lost node takes none
        d.place("d")
    assert d.join("n0", "tcp://n0-again:5555", 2) == 1              # a new incarnation
    assert d.stats()["nodes"]["n0"]["used"] == 0
    assert all(not d.closed(s) for s in on_n0)                     # their late closes: no-ops


def test_a_quiet_node_keeps_its_calls_and_takes_no_new_one_until_it_answers():
    """Bug it catches: one reading slower than the watch period ended a healthy node's calls
    (slow taken for dead), or a slow node kept taking calls that would wait on it."""
    d = fleet((2, 2))
    a = d.place("a")
    d.quiet(a.node, True)
    assert d.locate("a") == a and d.stats()["nodes"][a.node]["quiet"]
    assert d.place("b").node != a.node and d.place("c").node != a.node
    with pytest.raises(FleetFull) as full:
        d.place("d")
    assert full.value.reason == "capacity"
    d.quiet(a.node, False)
    assert d.place("d").node == a.node


def test_a_restored_directory_holds_what_the_nodes_say_and_places_around_it():
    """Bug it catches: a directory restarted empty placed calls past a node's slots (its live
    calls uncounted), handed a new call the id of a live one, or lost a call opened while it
    was being restored."""
    d = Directory()
    assert d.restore("a", "tcp://a:1", 2, 4, ["s1", "x"]) and d.restore("b", "tcp://b:1", 2, 0, [])
    assert not d.restore("a", "tcp://a:1", 2, 4, [])          # known already: its word stands
    assert d.locate("s1").node == "a" and d.locate("s1").incarnation == 4
    new = [d.place() for _ in range(2)]
    assert {p.node for p in new} == {"b"} and "s1" not in {p.session for p in new}
    with pytest.raises(FleetFull):
        d.place()
    assert d.join("a", "tcp://a:1", 2) == 5                    # a restart after it counts on
    assert d.locate("x") is None
    # a call placed before the restart and opened after the node restored it: the node's word
    # takes it in; the word of an earlier incarnation does not
    d.node_said("a", [("opened", "late")], incarnation=5)
    d.node_said("a", [("opened", "ghost")], incarnation=4)
    assert d.locate("late").node == "a" and d.locate("ghost") is None
    assert d.stats()["taken_in"] == 1 and d.stats()["nodes"]["a"]["used"] == 1
    d.node_said("a", [("closed", "late")], incarnation=5)
    assert d.locate("late") is None and d.stats()["nodes"]["a"]["used"] == 0


def test_a_node_new_to_a_restarted_directory_is_no_incarnation_seen_before():
    """Bug it catches: a node that restarted while the directory did too joined the new one as
    incarnation 0, the incarnation its old calls were placed on: their bridges then kept them
    as live on a node whose GPU state was gone. A restarted directory numbers from `first`."""
    before = Directory()
    assert before.join("a", "tcp://a:1", 2) == 0
    old = before.place("s1")
    after = Directory(first=1_700_000_000)
    assert after.join("a", "tcp://a:1", 2) == 1_700_000_000 != old.incarnation
    assert after.join("a", "tcp://a:1", 2) == 1_700_000_001    # a restart after it counts on
    assert after.current("a", old.incarnation) is None          # the old calls' word: stale


def test_a_refused_placement_is_given_back():
    d = fleet((1,))
    p = d.place("a")
    assert d.give_back(p.session) and d.counters.given_back == 1
    assert d.place("b").node == "n0"


def test_bad_input_is_refused_clearly():
    d = fleet()
    with pytest.raises(ValueError):
        d.join("n9", "tcp://x:1", 0)
    with pytest.raises(UnknownNode):
        d.drain("nope")
    with pytest.raises(ValueError, match="unknown placement"):
        policy("nearest")


def test_two_choices_picks_the_freer_of_two():
    nodes = OpenNodes()
    for load in (NodeLoad("a", 10, 9), NodeLoad("b", 10, 1)):
        nodes.update(load, takes_calls=True)
    assert all(policy("two_choices").pick(nodes, random.Random(s)).name == "b" for s in range(20))


EVENTS = st.lists(st.tuples(st.sampled_from(["place", "close", "drain", "lost", "join",
                                             "give_back", "undrain", "quiet", "answers"]),
                            st.integers(0, 40)), max_size=120)


@settings(max_examples=150, deadline=None)
@given(EVENTS, st.sampled_from(sorted(POLICIES)))
def test_no_call_on_a_full_or_draining_node_and_every_call_ends_once(events, name):
    """Bugs it catches: a placement on a full, draining or quiet node, a slot freed twice (a close
    after the node was lost), a session placed on two nodes, a call that never ends, a refusal
    while a node had room (the open-node index missed a change)."""
    d = fleet((2, 3, 1), name)
    live: set[str] = set()
    ended: list[str] = []
    seq = placed = 0
    for kind, k in events:
        names = sorted(d.nodes)
        if kind == "place":
            seq += 1
            open_before = {n: x.alive and not x.draining and not x.quiet
                           and len(x.sessions) < x.load.slots for n, x in d.nodes.items()}
            try:
                p = d.place(f"c{seq}")
            except FleetFull:
                assert not any(open_before.values())
                continue
            assert open_before[p.node]
            live.add(p.session)
            placed += 1
        elif kind in ("close", "give_back") and live:
            s = sorted(live)[k % len(live)]
            assert (d.closed if kind == "close" else d.give_back)(s)
            live.discard(s)
            ended.append(s)
        elif kind == "drain" and names:
            d.drain(names[k % len(names)])
        elif kind == "undrain" and names:
            d.undrain(names[k % len(names)])
        elif kind in ("quiet", "answers") and names:
            node = d.nodes[names[k % len(names)]]
            held = set(node.sessions)
            d.quiet(node.load.name, kind == "quiet")
            assert node.sessions == held                 # slow is not lost: calls stay
        elif kind == "lost" and names:
            gone = d.lost(names[k % len(names)])
            assert set(gone) <= live
            live -= set(gone)
            ended.extend(gone)
        elif kind == "join":                # new, or a restart: its sessions are gone
            old = d.nodes.get(f"n{k % 5}")
            gone = set(old.sessions) if old else set()
            d.join(f"n{k % 5}", "tcp://x:1", 1 + k % 3)
            live -= gone
            ended.extend(gone)
        for node in d.nodes.values():
            assert 0 <= node.load.used <= node.load.slots
            assert node.load.used == len(node.sessions)
        assert set(d.where) == live
        assert sum(len(n.sessions) for n in d.nodes.values()) == len(live)
    for s in sorted(live):
        assert d.closed(s)
        ended.append(s)
    assert len(ended) == len(set(ended)) == placed
    assert not d.where and all(n.load.used == 0 for n in d.nodes.values())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 4), st.integers(0, 3),
                          st.booleans()), min_size=1, max_size=200))
def test_the_open_node_index_gives_the_best_node_after_any_changes(changes):
    """Bug it catches: a heap entry left from before a node's change taken for its current
    state (most_free placing on a node that filled up or lost its headroom since), or a node
    that left still drawn."""
    index, loads, open_now = OpenNodes(), {}, set()
    for k, used, headroom, takes in changes:
        load = loads.setdefault(f"n{k}", NodeLoad(f"n{k}", 4))
        load.used, load.headroom_ms = used, float(headroom)
        index.update(load, takes and load.free > 0)
        (open_now.add if takes and load.free > 0 else open_now.discard)(load.name)
        taking = [loads[name] for name in sorted(open_now)]
        assert sorted(n.name for n in index) == sorted(open_now)
        if taking:
            want = min(taking, key=lambda n: (-n.free, -n.headroom_ms, n.name))
            assert index.best() is want
            assert all(index.draw(1, random.Random(s))[0] in taking for s in range(3))


def test_a_placement_no_node_confirms_is_given_back_and_a_confirmed_one_stays():
    """Bug it catches: a bridge that died between placing a call and opening it on the node
    held that slot for good; and the other way, a live call given back because its node's
    word was taken from another node."""
    d = Directory()
    d.join("a", "tcp://a:1", 3)
    d.join("b", "tcp://b:1", 3)
    confirmed, orphan = d.place("live").session, d.place("orphan").session
    node_of_live = d.locate(confirmed).node
    other = "b" if node_of_live == "a" else "a"
    d.node_said(other, [("closed", confirmed)])          # not its session: ignored
    d.node_said(node_of_live, [("opened", confirmed)])
    assert d.expire(60.0) == []                          # young: nothing given back yet
    assert d.expire(60.0, now=time.monotonic() + 61) == [orphan]
    assert d.locate(orphan) is None and d.locate(confirmed) is not None
    assert d.stats()["given_back"] == 1 and d.stats()["unconfirmed"] == 0
    d.node_said(node_of_live, [("closed", confirmed)])
    assert d.stats()["sessions"] == 0 and d.stats()["closes"] == 1
