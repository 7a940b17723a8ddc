"""The `wpk` executor's beat kernels on the CPU interpreter: reading frames where they lie in the
ring equals the host's `FramesToRead.rows` (stamps checked after the samples, torn places
silent and flagged), and the descriptor the host writes names the rows it was given."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from gpu.wpk.beat_kernels import Descriptor, frames_done, gate, gather_frames
from gpu.wpk.sync import interp
from wave_actors.core.frames import FRAMES_PER_BEAT, SAMPLES_IN
from wave_actors.core.sched.jitter import SILENCE
from wave_actors.core.sched.frame_places import FramesToRead, RingPlaces
from wave_actors.clock.shared_frames import FrameRing, layout

pytestmark = pytest.mark.skipif(not interp(), reason="Triton's CPU interpreter")

SLOTS, RING = 6, 8


def ring_with_frames(rng) -> tuple[FrameRing, np.ndarray, np.ndarray]:
    """A ring whose every slot holds frames 0..RING-1 of generation slot + 10."""
    ring = FrameRing(bytearray(layout(SLOTS, RING)[0]), SLOTS, RING)
    ring.generation[:] = -1
    ring.number[:] = -1
    ring.pcm[:] = 0.0
    gens = np.arange(SLOTS, dtype=np.int64) + 10
    for slot in range(SLOTS):
        for num in range(RING):
            ring.write(slot, int(gens[slot]), num, rng.standard_normal(SAMPLES_IN).astype(np.float32))
    return ring, gens


def run_gather(frames: FramesToRead, slots: np.ndarray, max_rows: int = SLOTS):
    desc_t = torch.zeros(Descriptor.words(max_rows), dtype=torch.int64)
    desc = Descriptor(desc_t.numpy(), max_rows)
    desc.write(slots, frames)
    ring = frames.ring
    audio = torch.full((SLOTS + 1, FRAMES_PER_BEAT, SAMPLES_IN), 7.0)
    torn = torch.full((SLOTS + 1, FRAMES_PER_BEAT), 5, dtype=torch.int32)
    gather_frames[(max_rows, FRAMES_PER_BEAT)](
        desc_t, torch.from_numpy(ring.number), torch.from_numpy(ring.generation),
        torch.from_numpy(ring.pcm), audio, torn, MAX_ROWS=max_rows, SAMPLES=SAMPLES_IN,
        BLOCK=2048, IS_INTERP=True)
    return audio.numpy(), torn.numpy()


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_frames_read_on_the_device_equal_the_hosts_read_with_torn_places_silent(data):
    """Catches a row read from the wrong place or slot, a stamp not checked (a rewritten place
    heard instead of silence), silence read as a frame, or rows past the count written."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    ring, gens = ring_with_frames(rng)
    slots = np.array(sorted(data.draw(st.sets(st.integers(0, SLOTS - 1), min_size=1))), np.int64)
    nums = np.array([[data.draw(st.sampled_from([SILENCE, 0, 1, 2, 3, 9])) for _ in range(2)]
                     for _ in range(SLOTS)], np.int64)
    places = np.where(nums == SILENCE, 0, ring.places(np.arange(SLOTS)[:, None],
                                                      np.maximum(nums, 0)))
    # Frame 9 lies where frame 1 was: its place holds frame 1 (a rewrite) and must read silent.
    want_gens = gens.copy()
    if data.draw(st.booleans()):
        want_gens[slots[0]] += 1              # an older session's frames: every stamp fails
    host = FramesToRead(RingPlaces(ring, want_gens), places, want_gens, nums)
    expect = host.rows(slots)
    audio, torn = run_gather(FramesToRead(RingPlaces(ring, want_gens), places, want_gens, nums),
                             slots)
    np.testing.assert_array_equal(audio[slots], expect)
    flagged = set(zip(*np.nonzero(torn[slots] == 1)))
    host_torn = {(int(np.searchsorted(slots, s)), int(f)) for ss, ff in host.torn
                 for s, f in zip(ss, ff)}
    assert flagged == host_torn
    others = np.setdiff1d(np.arange(SLOTS + 1), slots)
    assert (audio[others] == 7.0).all() and (torn[others] == 5).all()


def test_a_descriptor_with_no_frames_reads_nothing():
    rng = np.random.default_rng(0)
    ring, gens = ring_with_frames(rng)
    frames = FramesToRead(RingPlaces(ring, gens), np.zeros((SLOTS, 2), np.int64), gens,
                          np.full((SLOTS, 2), SILENCE, np.int64))
    desc_t = torch.zeros(Descriptor.words(SLOTS), dtype=torch.int64)
    desc = Descriptor(desc_t.numpy(), SLOTS)
    desc.write(np.arange(SLOTS), frames)
    assert desc.block[0] == SLOTS
    desc.write(np.arange(SLOTS), None)
    assert desc.block[0] == 0
    with pytest.raises(ValueError, match="8 rows in a beat; the descriptor holds 7"):
        Descriptor(np.zeros(Descriptor.words(7), np.int64), 7).write(np.arange(8) % 6, frames)


def test_the_gate_passes_at_its_run_and_frames_done_counts_both_frames():
    work = torch.tensor([3], dtype=torch.int32)
    gate[(1,)](work, 3, IS_INTERP=True)          # returns: 3 ≥ 3 (a wait below would hang)
    ctr = torch.zeros(2, dtype=torch.int32)
    for _ in range(2):
        frames_done[(1,)](ctr, IS_INTERP=True)
    assert ctr.tolist() == [2, 2]
