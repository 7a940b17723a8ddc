"""OutputTurns slices the session actors' work over turns of the event loop.

The bug it catches: a finished beat wakes every session at once, asyncio runs all ready tasks
before it fires a timer, and the next release wakes late behind the whole block. With slices,
a timer due now fires after at most one slice of work; nothing is lost or reordered."""
import asyncio

from hypothesis import given, settings, strategies as st

from wave_actors.runtime.turns import OutputTurns


async def _run(per_turn: int, sessions: int, hold_for: int = 0) -> list:
    turns = OutputTurns(per_turn)
    log: list = []

    async def session(i: int) -> None:
        await turns.turn()
        log.append(i)

    async def ticker() -> None:          # one mark per loop turn while sessions run
        for _ in range(4 * sessions + 8):
            log.append("tick")
            await asyncio.sleep(0)

    if hold_for:
        turns.hold()
    tasks = [asyncio.create_task(session(i)) for i in range(sessions)]
    tick = asyncio.create_task(ticker())
    for _ in range(hold_for):
        await asyncio.sleep(0)
    if hold_for:
        assert not any(isinstance(x, int) for x in log), "work ran inside a hold"
        turns.free()
    await asyncio.gather(*tasks)
    tick.cancel()
    return log


def _blocks(log: list) -> list[int]:
    """Session work items run between consecutive loop-turn marks."""
    blocks, n = [], 0
    for x in log:
        if x == "tick":
            blocks.append(n)
            n = 0
        else:
            n += 1
    return blocks + [n]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 8), st.integers(1, 60), st.integers(0, 3))
def test_each_loop_turn_runs_one_slice_at_most_in_arrival_order(per_turn, sessions, hold_for):
    log = asyncio.run(_run(per_turn, sessions, hold_for))
    assert max(_blocks(log)) <= per_turn
    assert [x for x in log if x != "tick"] == list(range(sessions))


def test_without_slices_every_session_runs_in_one_turn():
    """per_turn 0 is the unsliced behaviour: the whole beat's work in one block."""
    log = asyncio.run(_run(0, 40))
    assert max(_blocks(log)) == 40
