"""The batched output path of bench/host_batching.py equals the per-session one: a batched
resampler that mixed up channels, or a batched encode (`transports.audio.encode_rows`) that rounded differently, would fail."""
import numpy as np
import pytest

from bench.host_batching import BatchResampler, beat_frames
from transports.audio import StreamResampler, encode, encode_rows
from wave_actors.core.frames import OUT_RATE, SAMPLES_OUT

N, BEATS = 3, 3


@pytest.mark.parametrize("rate,fmt", [(8000, "pcmu"), (8000, "pcma"), (16000, "pcm_s16le"),
                                      (24000, "pcm_f32le"), (22050, "pcm_s16le")])
def test_batched_resample_and_encode_match_per_session(rate, fmt):
    frames = beat_frames(N, BEATS, seed=rate).reshape(-1, N, SAMPLES_OUT)   # frame by frame
    frames[0, 1, :50] = 1.5                       # past full scale: the clip must match too
    frames[0, 2, :50] = -1.5
    streams = [StreamResampler(OUT_RATE, rate) for _ in range(N)]
    batch = BatchResampler(N, OUT_RATE, rate)
    produced = 0
    for frame in frames:
        one = [rs(frame[i]) for i, rs in enumerate(streams)]
        many = batch(frame)
        assert many.shape == (N, len(one[0]))
        for i in range(N):
            assert np.max(np.abs(one[i] - many[i]), initial=0.0) <= 1e-6, f"channel {i}"
        assert encode_rows(many, fmt) == [encode(o, fmt) for o in one]
        produced += many.shape[1]
    assert produced > 0


def test_channels_are_not_interchangeable():
    """The sessions' inputs differ, so a channel swap could not pass the test above."""
    batch = BatchResampler(N, OUT_RATE, 8000)
    out = np.concatenate([batch(f) for f in beat_frames(N, 2, seed=1).reshape(-1, N, SAMPLES_OUT)],
                         axis=1)
    assert not np.allclose(out[0], out[1]) and not np.allclose(out[1], out[2])
