"""Invariants of the node on virtual time (issue 20, point 8), each with a checking function that
`test_mutations.py` calls on planted bugs:

  2. refusals only at capacity: `capacity` only when every slot is held; `admission` only when
     slots are free and the start policy's `admit` said no (`check_refusals`);
  3. bounded time to `opened`: with free slots and eager starts, open i (in open order) is
     answered within C_i + floor(sum_{j<i} C_j / R) beats, C the prompt's chunks and R the start
     rows a beat carries (`check_open_bounded`);
  4. end-to-end frame conservation: every frame a client sent is heard by the model, or counted
     in the session's `closed` stats as dropped (mailbox overflow, flood limit, the hold's bound,
     a full jitter buffer, shed, unheard at close) (`check_conservation`);

Invariant 1 (drops and underruns only where due) is `tests/runtime/test_invariants_jitter.py`;
5 (the sim and another executor decide starts alike) and 6 (a backlog drains once load falls)
are `test_invariants_starts.py`.
"""
from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.nodekit import VirtualNode, coded_frame, decode_code, slow_cost
from tests.sim.invariant_kit import EPS, NODE, instructions, open_one, tmp_dir
from transports.client import Refused
from wave_actors.core.contract import SessionSpec
from wave_actors.core.frames import BEAT_S
from wave_actors.core.sched.admission_policies import HeadroomAdmission
from wave_actors.core.sched.start_policy import EagerStarts
from wave_actors.node.flood import FloodPolicy
from wave_actors.sessions.session import SessionActor

# -- 2. refusals only at capacity --------------------------------------------------------------

POLICIES = {"eager": EagerStarts, "headroom": lambda: HeadroomAdmission(headroom_s=0.03)}
SLOTS_2 = 4
# ("open", prompt chars) | ("close", pick) | ("wait", beats)
OPS_2 = st.lists(st.one_of(st.tuples(st.just("open"), st.integers(0, 300)),
                           st.tuples(st.just("close"), st.integers(0, 9)),
                           st.tuples(st.just("wait"), st.integers(1, 6))), max_size=14)


def check_refusals(policy: str, ops: list) -> dict:
    """Runs `ops` one at a time on a node whose sessions cost 45 ms a beat (three live leave
    less than the headroom policy's 30 ms: it refuses); returns the refusals by reason."""
    start_policy = POLICIES[policy]()
    said: list = []                     # every answer the policy's admit gave
    if hasattr(start_policy, "admit"):
        admit = start_policy.admit
        start_policy.admit = lambda *a: said.append(admit(*a)) or said[-1]
    vn = VirtualNode(SLOTS_2, slow_cost(tmp_dir(), 45.0), start_policy=start_policy)
    table = vn.node.clock_actor.slots.table
    live, refusals, n = [], {}, 0
    try:
        for op in ops:
            if op[0] == "wait":
                vn.settle(op[1] * BEAT_S)
            elif op[0] == "close" and live:
                vn.run(live.pop(op[1] % len(live)).close())
            elif op[0] == "open":
                n += 1
                free, asked = table.free_slots, len(said)
                _, answer = vn.run(open_one(vn, f"s{n}", op[1]))
                if isinstance(answer, Refused):
                    refusals[answer.reason] = refusals.get(answer.reason, 0) + 1
                    if answer.reason == "capacity":
                        assert free == 0, f"refused capacity with {free} slots free"
                    else:
                        assert answer.reason == "admission", answer
                        assert free > 0, "refused admission when the slots were full"
                        assert len(said) > asked and said[-1], \
                            "refused admission though the policy admitted the open"
                    continue
                assert free > 0, "an open admitted with no slot free"
                assert len(said) == asked or said[-1] is None, "opened though admit said no"
                live.append(answer)
    finally:
        vn.close()
    return refusals


@NODE
@given(st.sampled_from(sorted(POLICIES)), OPS_2)
def test_refusals_only_at_capacity_or_by_the_policy(policy, ops):
    """Catches: `capacity` answered with slots free (a table that refuses its last slot, a clock
    that crashes on an open and leaves the opener unanswered); `admission` answered with every
    slot held, or although the policy's `admit` admitted the open."""
    check_refusals(policy, ops)


def test_both_kinds_of_refusal_happen_where_due():
    """The property above is not vacuous: a full node refuses `capacity`; a node whose beats
    overrun refuses `admission` with slots free."""
    assert check_refusals("eager", [("open", 0)] * (SLOTS_2 + 1)) == {"capacity": 1}
    ops = [("open", 0)] * 3 + [("wait", 3), ("open", 0)]
    assert check_refusals("headroom", ops) == {"admission": 1}


def test_headroom_admits_again_once_the_load_it_measured_has_left():
    """Catches the headroom policy holding a slow beat's time after every session left: an
    idle node runs no beat that would replace it, and every open from then on was refused
    (a closed loop under `headroom` near its threshold never opened a call again)."""
    policy = HeadroomAdmission(headroom_s=0.03)
    policy.observe(3, False, 0.150)
    assert policy.admit(3, 0, SLOTS_2) is not None            # 150 + 30 ms: past the beat
    assert policy.admit(0, 1, SLOTS_2) is not None            # one starting: still that load
    assert policy.admit(0, 0, SLOTS_2) is None                # nothing live or starting
    policy.observe(1, True, 0.150)                            # a beat with rows: not read
    assert policy.admit(1, 0, SLOTS_2) is not None
    policy.observe(1, False, 0.120)
    assert policy.admit(1, 0, SLOTS_2) is None


# -- 3. bounded time to opened -----------------------------------------------------------------

def open_bound_beats(chunks: list[int], rows: int) -> list[int]:
    """Beats until each start (in open order) is answered: its own C_i chunks, plus a beat for
    every R chunks of older starts (a beat gives R rows, oldest first)."""
    return [c + sum(chunks[:i]) // rows for i, c in enumerate(chunks)]


def check_open_bounded(prompts: list[int], offset_s: float = 0.0,
                       snapshot_mb: float = -1.0) -> None:
    """Opens a session of each prompt length (characters) at once, `offset_s` into a beat, on a
    node with a slot for each; every one must be answered `opened` within its bound (with
    prompt snapshots too: a start that copies is answered the beat after the one whose rows
    made its snapshot)."""
    vn = VirtualNode(len(prompts) + 1, start_policy=EagerStarts(), snapshot_mb=snapshot_mb)
    ex, shape = vn.executor, vn.executor.start_shape
    chunks = [math.ceil(len(ex.prompt_tokens(SessionSpec(instructions(p)))) / shape.prefill_chunk)
              for p in prompts]
    bounds = open_bound_beats(chunks, shape.start_rows)
    if snapshot_mb != 0:
        # a start whose prompt an older one of this burst is prefilling copies that one's
        # snapshot, which is saved after the rows of its last beat: the copy rides the beat
        # after it, so it is answered one beat later. With more distinct prompts in the burst
        # than snapshot entries, a later save of the same beat may take that snapshot's entry:
        # the first follower then prefills its own rows the beat after, and the next ones copy
        # its snapshot a beat after that
        evicting = len(set(prompts)) > ex.snapshot_space.entries
        first = {}
        for i, p in enumerate(prompts):
            if p in first:
                bounds[i] = bounds[first[p]] + 1 + (chunks[i] + 1 if evicting else 0)
            first.setdefault(p, i)

    async def opens():
        await asyncio.sleep(offset_s)
        t0 = vn.clock.now()
        answers = await asyncio.gather(*[open_one(vn, f"s{i}", p) for i, p in enumerate(prompts)])
        return [(t - t0, a) for t, a in answers]

    try:
        for i, ((took, answer), bound) in enumerate(zip(vn.run(opens()), bounds)):
            assert not isinstance(answer, Refused), f"open {i} refused with slots free: {answer}"
            assert took <= bound * BEAT_S + EPS, \
                f"open {i} ({chunks[i]} chunks) took {took / BEAT_S:.2f} beats, bound {bound}"
    finally:
        vn.close()


# every count of opens alike (a list strategy favours short lists, and a start served out of
# order shows only once several starts queue for rows)
OPENS_3 = st.integers(1, 24).flatmap(
    lambda n: st.lists(st.integers(0, 480), min_size=n, max_size=n))


@settings(max_examples=10, deadline=None, database=None)
@given(OPENS_3, st.floats(0.0, BEAT_S), st.sampled_from([-1.0, 0.0]))
def test_opened_within_the_beats_its_start_shape_needs(prompts, offset, snapshot_mb):
    """Catches: a start never given rows (its open unanswered, or refused on timeout); starts
    delayed beyond the shape's need (rows carried only some beats, a start waiting behind
    younger ones, a finished start not answered the beat it goes live); with prompt snapshots
    or without."""
    check_open_bounded(prompts, offset, snapshot_mb)


# -- 4. end-to-end frame conservation ----------------------------------------------------------

MAILBOX = 16                # audio messages a session's mailbox holds in check_conservation
# Per session: (frames per message, bursts of messages with the beats waited after each).
# Bursts back to back (no wait) are drawn often: a reorder buffer held past its bound by flood
# drops ahead of it needs a run of them.
BURSTS = st.lists(st.tuples(st.integers(1, 3),
                            st.lists(st.tuples(st.integers(1, 200),
                                               st.sampled_from([0, 0, 0, 1, 3, 12])),
                                     min_size=1, max_size=3)), min_size=1, max_size=3)


def check_conservation(sessions: list, once: bool = False) -> dict:
    """Sends each session's bursts (a burst goes out without yielding to the node), closes them
    and checks every frame sent is heard by the model (the sim's trace) or counted in `closed`;
    returns the drops seen by kind, so a test can show which paths it took. `once`: also that
    no frame is counted twice (heard + dropped == sent exactly). The flood
    limit is low and the sessions' mailboxes small, so bursts overflow both (a mailbox overflows
    when more audio arrives between two turns of its actor than it holds: on a busy loop)."""
    cap, SessionActor.audio_cap = SessionActor.audio_cap, MAILBOX
    vn = VirtualNode(len(sessions), max_queue=8, start_policy=EagerStarts(),
                     flood=FloodPolicy(rate=50.0, burst=150.0))
    kinds = {"mailbox": 0, "flood": 0, "held_overflow": 0, "clock": 0}
    try:
        opened = [vn.run(vn.client.open(f"s{i}")) for i in range(len(sessions))]
        actors = [vn.node.sessions[(vn.client.identity, f"s{i}")] for i in range(len(sessions))]
        sent = [0] * len(sessions)
        for step in range(max(len(b) for _, b in sessions)):
            for i, (per, bursts) in enumerate(sessions):
                if step < len(bursts):
                    vn.run(_burst(opened[i], i + 1, sent[i], bursts[step][0], per))
                    sent[i] += bursts[step][0] * per
            wait = max(b[step][1] if step < len(b) else 0 for _, b in sessions)
            vn.settle(wait * BEAT_S + 0.001)
        closed = [vn.run(cs.close()) for cs in opened]
        heard = _heard(vn.executor.trace)
        for i, (c, actor) in enumerate(zip(closed, actors)):
            s, got = c.stats, heard.get(i + 1, [])
            assert s["frames_in"] + s["dropped_in"] >= sent[i], \
                f"session {i}: sent {sent[i]}, heard {s['frames_in']}, dropped " \
                f"{s['dropped_in']}: frames lost without a count"
            assert not once or s["frames_in"] + s["dropped_in"] == sent[i], \
                f"session {i}: sent {sent[i]}, heard {s['frames_in']}, dropped " \
                f"{s['dropped_in']}: frames counted twice"
            assert got == sorted(set(got)) and all(f < sent[i] for f in got), \
                f"session {i}: the model heard frames repeated, reordered or never sent"
            assert len(got) == s["frames_in"], \
                f"session {i}: the model heard {len(got)} frames, `closed` says {s['frames_in']}"
            kinds["mailbox"] += actor.counters.dropped_in_mailbox
            kinds["flood"] += actor.counters.flooded
            kinds["held_overflow"] += actor.counters.held_overflow
        kinds["clock"] = vn.node.clock_actor.jitter_totals.dropped
    finally:
        vn.close()
        SessionActor.audio_cap = cap
    return kinds


async def _burst(cs, no: int, first: int, messages: int, per: int) -> None:
    for m in range(messages):
        f = first + m * per
        await cs.send_audio(b"".join(coded_frame(no, f + k) for k in range(per)))


def _heard(trace) -> dict[int, list[int]]:
    """Session number -> the frame numbers the sim was handed, in order (silence left out)."""
    heard: dict[int, list[int]] = {}
    for _beat, _slot, first, last in trace:
        assert first == last
        if first != 0.0:
            no, frame = decode_code(first)
            heard.setdefault(no, []).append(frame)
    return heard


@pytest.mark.slow
@settings(max_examples=45, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(BURSTS)
def test_every_frame_sent_is_heard_or_counted(sessions):
    """Catches: frames lost without a count anywhere between the socket and the model (a
    mailbox that drops audio uncounted, a jitter buffer or release that forgets queued frames,
    held frames not counted at close), frames counted twice (a given-up seq counted again when
    its message comes after all), and frames counted as heard that the model never got."""
    check_conservation(sessions, once=True)


def test_conservation_covers_mailbox_drops():
    """The property holds with drops in play: a burst overflows the session's mailbox and the
    flood limit; held frames and queued ones are counted at close."""
    kinds = check_conservation(CONSERVATION_CASE, once=True)
    assert kinds["mailbox"] > 0 and kinds["flood"] > 0, kinds


CONSERVATION_CASE = [(1, [(200, 2)]), (2, [(20, 1), (3, 0)])]


def test_a_dropped_message_is_counted_once():
    """Catches frames counted as dropped twice: `closed` then reports more frames than the
    client sent, and drop rates read high."""
    check_conservation([(1, [(60, 3)])], once=True)


REORDER_BOUND_CASE = [(1, [(102, 0), (128, 0)])]


def test_frames_past_the_reorder_buffers_bound_are_counted_once():
    """Catches frames counted twice when a gap is given up on while its messages still wait in
    the mailbox (flood drops ahead of them hold the reorder buffer past its bound): counted as
    a seq gap, then again as stale when they arrive (sent 230, heard + dropped 246)."""
    check_conservation(REORDER_BOUND_CASE, once=True)
