"""Sample formats: G.711 exact against the ITU reference algorithm, PCM conversion, streaming
resampling equal to one-shot resampling."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from transports import audio as A


# -- the ITU-T G.711 reference (segment search, as in Sun's g711.c), one sample at a time -------
def _search(v, table):
    for i, t in enumerate(table):
        if v <= t:
            return i
    return len(table)


def ref_linear2ulaw(p):
    p >>= 2
    mask = 0xFF
    if p < 0:
        p, mask = -p, 0x7F
    p = min(p, 8159) + 0x21
    seg = _search(p, [0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
    return (0x7F if seg >= 8 else (seg << 4) | ((p >> (seg + 1)) & 0xF)) ^ mask


def ref_linear2alaw(p):
    p >>= 3
    if p >= 0:
        mask = 0xD5
    else:
        mask, p = 0x55, -p - 1
    seg = _search(p, [0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])
    if seg >= 8:
        return 0x7F ^ mask
    return ((seg << 4) | ((p >> (1 if seg < 2 else seg)) & 0xF)) ^ mask


def ref_ulaw2linear(u):
    u = ~u & 0xFF
    t = (((u & 0xF) << 3) + 0x84) << ((u & 0x70) >> 4)
    return 0x84 - t if u & 0x80 else t - 0x84


def ref_alaw2linear(a):
    a ^= 0x55
    t, seg = (a & 0xF) << 4, (a & 0x70) >> 4
    t = t + 8 if seg == 0 else (t + 0x108) << max(seg - 1, 0)
    return t if a & 0x80 else -t


def test_g711_encoders_match_the_reference_for_every_int16():
    pcm = np.arange(-32768, 32768, dtype=np.int16)
    u = np.frombuffer(A.int16_to_ulaw(pcm), np.uint8)
    a = np.frombuffer(A.int16_to_alaw(pcm), np.uint8)
    assert all(int(u[i]) == ref_linear2ulaw(int(p)) for i, p in enumerate(pcm))
    assert all(int(a[i]) == ref_linear2alaw(int(p)) for i, p in enumerate(pcm))


def test_g711_decoders_match_the_reference_for_every_code():
    codes = bytes(range(256))
    assert A.ulaw_to_int16(codes).tolist() == [ref_ulaw2linear(c) for c in range(256)]
    assert A.alaw_to_int16(codes).tolist() == [ref_alaw2linear(c) for c in range(256)]
    assert A.ulaw_to_int16(b"\xff")[0] == 0 and A.alaw_to_int16(b"\xd5")[0] == 8


@given(st.lists(st.integers(-32768, 32767), min_size=1, max_size=200))
def test_g711_round_trip_error_is_within_a_quantisation_step(values):
    pcm = np.array(values, np.int16)
    for enc, dec in ((A.int16_to_ulaw, A.ulaw_to_int16), (A.int16_to_alaw, A.alaw_to_int16)):
        back = dec(enc(pcm)).astype(np.int32)
        err = np.abs(back - pcm.astype(np.int32))
        # G.711 is logarithmic: the step grows with magnitude, at most 1/16 of it (plus bias)
        assert np.all(err <= np.abs(pcm.astype(np.int32)) // 16 + 132)
        assert np.array_equal(enc(back.astype(np.int16)), enc(pcm))   # decode is a fixpoint


@pytest.mark.parametrize("fmt", ["pcm_s16le", "pcm_f32le", "pcmu", "pcma"])
def test_decode_encode_formats(fmt):
    x = np.linspace(-0.9, 0.9, 321).astype(np.float32)
    y = A.decode(A.encode(x, fmt), fmt)
    tol = {"pcm_f32le": 0, "pcm_s16le": 1 / 32767, "pcmu": 0.03, "pcma": 0.03}[fmt]
    assert y.dtype == np.float32 and len(y) == len(x)
    np.testing.assert_allclose(y, x, atol=tol)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([(8000, 16000), (24000, 16000), (48000, 16000), (22050, 8000),
                        (22050, 24000)]),
       st.lists(st.integers(1, 900), min_size=1, max_size=30))
def test_streaming_resampler_equals_one_shot(rates, chunks):
    src, dst = rates
    rng = np.random.default_rng(len(chunks))
    x = rng.standard_normal(sum(chunks)).astype(np.float32) * 0.1
    stream = A.StreamResampler(src, dst)
    parts, i = [], 0
    for n in chunks:
        parts.append(stream(x[i:i + n]))
        i += n
    parts.append(stream(np.zeros(0, np.float32), last=True))
    streamed = np.concatenate(parts)
    whole = A.StreamResampler(src, dst)(x, last=True)
    assert len(streamed) == len(whole)
    np.testing.assert_allclose(streamed, whole, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["pcm_f32le", "pcm_s16le", "pcmu", "pcma"]),
       st.integers(1, 6), st.integers(1, 300), st.integers(0, 2**32 - 1))
def test_encoding_rows_together_gives_each_row_what_it_gets_alone(fmt, rows, samples, seed):
    """A worker encodes its sessions' audio of one format as one array: each row's bytes must
    be that row's own encoding (catches rows mixed up, or a clip or rounding that depends on
    the other rows), including samples outside [-1, 1]."""
    block = (np.random.default_rng(seed).standard_normal((rows, samples)) * 0.7).astype(np.float32)
    assert A.encode_rows(block, fmt) == [A.encode(row, fmt) for row in block]
