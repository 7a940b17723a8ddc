"""A session started from a prompt snapshot is the same session as one started by prefill.

Each case runs the same calls twice on a fresh executor, once with snapshots and once without
(every start prefills), and compares a session's outputs frame by frame (its own frame index:
a copy-start goes live sooner, so the beats differ but the session's frames must not). Audio is
a function of the frame index only, so both runs feed it the same. fp32 on the CPU: bit for bit.
On the graph executor (the serving profiles, CUDA graphs on) the same, the cache cold and warm.

Bugs these catch: a copy that reads another slot's state (planted below: the check fails); a
snapshot missing a part of the start state (the SSM, the conv columns, KV rows, the length); a
save taken before the prompt's last chunk ran; a prefix resumed at the wrong position; a slot
whose last session closed, started again from a clean (its reset behind an earlier beat) that
left some of that session's state behind (planted below).
"""
import asyncio

import numpy as np
import pytest
import torch

from gpu.engine.slot_resets import SlotResets
from gpu.engine.snapshot_rows import SnapshotRows
from bench.harness.beat_driver import BeatDriver
from wave_actors.core.contract import ExecutorOptions, SessionSpec

SLOTS = 4
INSTRUCTIONS = "You are the front desk of a small hotel. Answer briefly and kindly. " * 2
TOOL = lambda name: {"type": "function", "function": {"name": name, "parameters": {}}}  # noqa: E731


def build(name: str, snapshots: bool, profile: str = "fp32"):
    opts = ExecutorOptions(max_sessions=SLOTS, max_context=64, profile=profile,
                           snapshot_mb=-1 if snapshots else 0)
    if name == "cpu":
        from gpu.engine.cpu_executor import CpuExecutor
        return CpuExecutor(opts)
    from gpu.engine.graph_executor import GraphExecutor
    return GraphExecutor(opts)


def frame_audio(plan) -> np.ndarray:
    """Each live slot hears the audio of its own frame index."""
    a = np.zeros((SLOTS, 2, 1280), np.float32)
    for slot, f0 in zip(plan.live, plan.frame0.tolist()):
        a[slot] = 0.1 * np.random.default_rng(f0).standard_normal((2, 1280))
    return a


async def run_calls(ex, calls: list[tuple[int, int, SessionSpec]], beats: int = 14) -> dict:
    """calls: (beat, slot, spec) opens (spec None: a close). Returns slot → {frame index:
    outputs of that frame, -1: the state its first frame read}."""
    d = BeatDriver(ex)
    heard: dict = {"resets": [], "cleans": []}
    for k in range(beats):
        for beat, slot, spec in calls:
            if beat == k and spec is None:
                d.close(slot)
            elif beat == k:
                d.open(slot, spec)
        waiting = [s for s in range(SLOTS) if not d.ready(s)]
        plan, out = await d.beat(frame_audio)
        heard["resets"] += plan.resets
        heard["cleans"] += plan.cleans
        for slot in waiting:
            if d.ready(slot):           # its start is done: the state its first frame reads
                heard.setdefault(slot, {})[-1] = start_state(ex, slot)
        for slot, f0 in zip(plan.live, plan.frame0.tolist()):
            for f in range(2):
                heard.setdefault(slot, {})[f0 + f] = (
                    out.pcm[slot, f].copy(), int(out.text[slot, f]), int(out.func[slot, f]),
                    out.user[slot, f].copy())
    heard["book"] = d.book
    return heard


LAYER_FIRST = {"perception.k", "perception.v", "perception.time", "thinker.ssm", "thinker.conv",
               "thinker.k", "thinker.v"}


def start_state(ex, slot: int) -> tuple:
    """The slot's whole state as its first frame reads it (KV rows up to each cache's length)."""
    st = ex.runner.state
    n, m = int(st.thinker.length[slot]), int(st.talker.position[slot])
    parts = []
    for name, t in st.tensors():
        if name.startswith("rnnt.start"):
            continue
        row = t[:, slot] if name in LAYER_FIRST else t[slot]
        if name in ("thinker.k", "thinker.v"):
            row = row[:, :n]
        if name in ("talker.k", "talker.v"):
            row = row[..., :m, :]
        parts.append(row.detach().cpu().clone())
    return tuple(parts)


def same(a: dict, b: dict, frames: int = 12) -> bool:
    differ = [i for i, (x, y) in enumerate(zip(a[-1], b[-1])) if not torch.equal(x, y)]
    if differ:
        print("start states differ in parts", differ)
        return False
    keys = sorted(set(a) & set(b) - {-1})[:frames]
    assert len(keys) >= 8, f"too few frames to compare: {len(keys)}"
    bad = [k for k in keys if not (np.array_equal(a[k][0], b[k][0]) and a[k][1:3] == b[k][1:3]
                                   and np.array_equal(a[k][3], b[k][3]))]
    if bad:
        print("outputs differ at frames", bad)
    return not bad


def compare(name: str, calls, slot: int, profile: str = "fp32", beats: int = 18):
    beats += 0 if name == "cpu" else 18        # the graph's starts take a beat per 16 tokens
    with_snap = asyncio.run(run_calls(build(name, True, profile), calls, beats))
    plain = asyncio.run(run_calls(build(name, False, profile), calls, beats))
    return with_snap, plain, same(with_snap[slot], plain[slot])


@pytest.fixture(params=["cpu", pytest.param("graph", marks=pytest.mark.gpu)])
def name(request):
    return request.param


def alone_after(name: str, spec, first: int = 0, later: int = 2) -> list:
    """`first` opens at beat 0 and leaves once live; `later` opens after it: alone in its beats
    in both runs. (On the GPU a row's last bits depend on its company in the beat: the
    attention's split over the longest context, the batch's GEMM kernel; so a session is
    compared where its company is the same.)"""
    gone = 7 if name == "cpu" else 14
    return [(0, first, spec), (gone, first, None), (gone + 1, later, spec)]


def test_a_warm_start_is_the_prefilled_start(name):
    spec = SessionSpec(instructions=INSTRUCTIONS)
    calls = alone_after(name, spec)
    snap, _, equal = compare(name, calls, 2)
    book = snap["book"].snapshots.describe()
    assert book["hits"] == 1 and book["saves"] == 1, book      # slot 2 really copied
    assert equal
    # and the cold start (the first session, which prefilled and was saved) is unchanged
    assert same(snap[0], compare(name, calls, 0)[1][0])


@pytest.mark.slow
def test_a_prefix_snapshot_resumes_at_its_end(name):
    specs = [SessionSpec(instructions=INSTRUCTIONS, tools=[TOOL(t)])
             for t in ("book_room", "cancel_booking", "late_checkout")]
    # the prefix is made by the second prompt's rows while the first's run beside them
    late = 5 if name == "cpu" else 14         # once the second's rows passed the prefix
    calls = [(0, 0, specs[0]), (2, 1, specs[1]), (late - 1, 0, None), (late - 1, 1, None),
             (late, 3, specs[2])]
    snap, _, equal = compare(name, calls, 3, beats=16)
    book = snap["book"].snapshots.describe()
    assert book["prefix_hits"] == 1 and book["hits"] == 0, book
    assert equal


@pytest.mark.slow
def test_sessions_from_one_snapshot_still_draw_their_own_noise(name):
    spec = SessionSpec(instructions=INSTRUCTIONS)
    snap = asyncio.run(run_calls(build(name, True), [(0, 0, spec), (3, 1, spec), (3, 2, spec)],
                                 14 if name == "cpu" else 32))
    assert snap["book"].snapshots.hits == 2
    assert all(torch.equal(x, y) for x, y in zip(snap[1][-1], snap[2][-1]))   # one start state
    frames = sorted(set(snap[1]) - {-1})
    # same prompt, same audio, same start: each still draws its own noise
    assert any(not np.array_equal(snap[1][f][0], snap[2][f][0]) for f in frames)


def test_the_check_catches_a_copy_that_reads_another_slot(name, monkeypatch):
    """Planted: the copy takes slot 0's thinker state (a session mid-call) instead of the
    snapshot entry: the warm start must then differ from the prefilled one."""
    def stale_copy(self, copies):
        for slot, _entry, positions in copies:
            th = self.state.thinker
            th.ssm[:, slot] = th.ssm[:, 0]
            th.conv[:, slot] = th.conv[:, 0]
            th.k[:, slot, :positions] = th.k[:, 0, :positions]
            th.v[:, slot, :positions] = th.v[:, 0, :positions]
            th.length[slot] = positions
    monkeypatch.setattr(SnapshotRows, "copy_in", stale_copy)
    spec = SessionSpec(instructions=INSTRUCTIONS)
    late = 5 if name == "cpu" else 14          # slot 0 is mid-call by then
    assert not compare(name, [(0, 0, spec), (late, 2, spec)], 2, beats=16)[2]


def reused(name: str, spec, first: int) -> list:
    """`first` opens at beat 0 and leaves once live; slot 0 opens two beats later (after the
    clean of `first`'s slot): alone in its beats, as `alone_after`."""
    gone = 7 if name == "cpu" else 14
    return [(0, first, spec), (gone, first, None), (gone + 2, 0, spec)]


def reused_start(name: str) -> tuple[dict, dict, bool]:
    """A snapshot start into a slot cleaned after its last session against a prefill start
    into a slot never used (snapshots off): the same session, frame by frame."""
    spec = SessionSpec(instructions=INSTRUCTIONS)
    again = asyncio.run(run_calls(build(name, True), reused(name, spec, 0),
                                  18 if name == "cpu" else 36))
    fresh = asyncio.run(run_calls(build(name, False), reused(name, spec, 1),
                                  18 if name == "cpu" else 36))
    return again, fresh, same(again[0], fresh[0])


@pytest.mark.slow
def test_a_start_in_a_cleaned_slot_is_a_start_in_a_new_one(name):
    again, _, equal = reused_start(name)
    assert again["book"].snapshots.describe()["hits"] == 1
    assert again["cleans"] == [0] and again["resets"] == [0]    # its first session's reset only
    assert equal


@pytest.mark.slow
def test_the_check_catches_a_clean_that_leaves_the_last_session_behind(name, monkeypatch):
    """Planted: a clean that does nothing. The slot's next session then starts on what the
    last one left (the talker's caches and position, perception, the RNNT's state)."""
    monkeypatch.setattr(SlotResets, "clean", lambda self, slots: None)
    assert not reused_start(name)[2]


@pytest.mark.gpu
@pytest.mark.parametrize("profile", ["reference", "dense"])
def test_graph_serving_profiles_warm_equals_prefilled(profile):
    spec = SessionSpec(instructions=INSTRUCTIONS)
    snap, _, equal = compare("graph", alone_after("graph", spec), 2, profile)
    assert snap["book"].snapshots.hits == 1
    assert equal


def test_opens_of_one_prompt_together_prefill_it_once():
    """Three opens of one prompt in one beat: the oldest prefills it, the others wait for its
    snapshot and copy it in the beat after its last chunk (no rows of their own)."""
    d = BeatDriver(build("cpu", True))
    for s in range(3):
        d.open(s, SessionSpec(instructions=INSTRUCTIONS))
    plans = [asyncio.run(d.beat(frame_audio))[0] for _ in range(6)]
    assert {slot for p in plans for slot, _, _ in p.rows} == {0}
    copied = [p.copies for p in plans if p.copies]
    assert len(copied) == 1 and sorted(s for s, _, _ in copied[0]) == [1, 2]
    last_row = max(i for i, p in enumerate(plans) if p.rows)
    assert plans.index(next(p for p in plans if p.copies)) == last_row + 1
    assert all(d.ready(s) for s in range(3))


def test_a_close_mid_prefill_hands_the_prompt_to_a_waiter():
    """The slot prefilling a prompt closes before its last chunk: a session waiting for that
    prompt's snapshot prefills it itself (it never waits for a snapshot nobody makes)."""
    d = BeatDriver(build("cpu", True))
    spec = SessionSpec(instructions=INSTRUCTIONS)
    d.open(0, spec)
    d.open(1, spec)
    asyncio.run(d.beat(frame_audio))
    d.close(0)
    plans = [asyncio.run(d.beat(frame_audio))[0] for _ in range(5)]
    assert any(slot == 1 for p in plans for slot, _, _ in p.rows)
    assert d.ready(1) and d.book.snapshots.describe()["saves"] == 1
