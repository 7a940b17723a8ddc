"""The Realtime bridge's input feed (`transports/realtime/feed.py`), on a scripted clock.

Bugs these catch: input sent to the node faster than real time (the node's jitter buffer
overflows and drops it: a 15 s burst lost 11 s), a quiet client's session left with no input
(the node closes it as idle: a muted microphone ended the call), silence inserted while the
client's own audio waits (the model hears gaps in speech), silence that does not keep up
with real time once the client went quiet, audio past the bound queued anyway (memory) or
refused without a count, and bytes lost or reordered on the way."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from transports.realtime.feed import FeedPolicy, InputFeed

BPS = 16000 * 4                     # the node's input: 16 kHz f32


def feed(**kw) -> InputFeed:
    return InputFeed(FeedPolicy(**kw), BPS, 4, 64 << 10)


def test_a_burst_goes_out_at_real_time_plus_the_lead_in_order():
    f = feed(lead_s=0.24)
    data = bytes(range(256)) * (BPS * 5 // 256)           # 5 s at once
    assert f.push([data], 0.0)
    out, t = [], 0.0
    while t <= 6.0:
        got = f.take(t)
        out += got
        sent = sum(map(len, out))
        assert sent <= round((t + 0.24) * BPS) + 4, (t, sent)
        t += 0.04
    got = b"".join(out)
    assert got[:len(data)] == data and not any(got[len(data):])   # then silence, once quiet


def test_a_quiet_client_is_fed_silence_that_keeps_up_with_real_time():
    f = feed(silence_after_s=0.5)
    assert f.take(0.0) == []
    assert f.take(0.4) == []                              # a short gap is the network's
    silence = f.take(0.6)
    assert silence and not any(b"".join(silence))
    assert f.sent == round(0.6 * BPS)
    f.take(0.7)                                           # then every tick, not every 0.5 s
    assert f.sent == round(0.7 * BPS)
    f.push([bytes([1]) * 4], 0.72)                        # it speaks again: no more silence
    f.take(0.76)
    f.take(1.0)
    assert f.sent == round(0.7 * BPS) + 4


def test_a_client_streaming_slower_than_real_time_gets_no_silence_between_appends():
    f = feed(silence_after_s=0.5, lead_s=0.0)
    t = 0.0
    for _ in range(200):                                  # 80 ms chunks every 90 ms
        f.push([bytes([1]) * int(0.08 * BPS)], t)
        for _ in range(2):
            for m in f.take(t):
                assert all(m)
            t += 0.045
    assert f.silence_bytes == 0


def test_no_silence_while_the_clients_audio_waits():
    f = feed(lead_s=0.0, silence_after_s=0.1)
    f.take(0.0)
    f.push([bytes([1]) * BPS], 0.0)                       # 1 s queued, sent at real time
    for i in range(1, 26):
        for m in f.take(i * 0.04):
            assert all(m), "silence went out with the client's audio still queued"


def test_past_the_bound_an_append_is_refused_whole_and_counted():
    f = feed(capacity_s=1.0)
    assert f.push([bytes(BPS // 2)], 0.0)
    assert not f.push([bytes(BPS)], 0.0)
    assert f.refused_bytes == BPS and f.queued == BPS // 2
    assert not f.push([bytes(BPS // 4), bytes(BPS // 2)], 0.0)     # one append: all or none
    assert f.queued == BPS // 2
    assert f.clear() == BPS // 2 and f.queued == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3 * BPS // 4) .map(lambda n: n - n % 4),
                          st.floats(0.0, 0.5)), max_size=12))
def test_every_byte_pushed_goes_out_once_in_order(appends):
    """Random appends at random gaps: the client's bytes come out whole, in order, between
    the silence; nothing is ever sent ahead of real time plus the lead."""
    f = feed(capacity_s=60.0, lead_s=0.24, silence_after_s=0.5)
    t, pushed, out = 0.0, [], []
    for i, (n, gap) in enumerate(appends):
        chunk = bytes([1 + i % 250]) * n
        assert f.push([chunk], t)
        pushed.append(chunk)
        end = t + gap
        while t < end:
            out += f.take(t)
            assert f.sent <= (t + 0.24) * BPS + 4
            t += 0.04
    while f.queued:
        out += f.take(t)
        t += 0.04
    audio = b"".join(m for m in out if any(m))
    assert audio == b"".join(pushed)


def test_pieces_taken_but_not_sent_go_back_in_order():
    """The sender stopped midway (a close) after taking a catch-up's worth: what it did not
    send is queued again, first, and the silence among it forgotten. Catches a close losing
    seconds of taken-but-unsent audio from every count (seen under load: 62 frames)."""
    f = feed(lead_s=0.0, silence_after_s=0.5)
    f.take(0.0)
    f.take(1.0)                                           # 1 s of silence, nothing appended
    f.push([bytes([7]) * BPS, bytes([8]) * BPS], 1.0)
    pieces = f.take_pieces(3.0)                           # a stalled loop catches up: 2 s
    assert [silence for _, silence in pieces] == [False] * len(pieces)
    f.requeue(pieces[1:])                                 # one message went out
    assert f.queued == 2 * BPS - len(pieces[0][0])
    assert f.sent == round(1.0 * BPS) + len(pieces[0][0])
    rest = b"".join(f.take(10.0))
    assert rest.startswith(b"".join(p for p, _ in pieces[1:]))
    assert f.queued == 0
    before, sent = f.silence_bytes, f.sent
    f.requeue([(bytes(8), True)])                         # silence is not queued again
    assert (f.silence_bytes, f.sent, f.queued) == (before - 8, sent - 8, 0)


def test_policies_refuse_nonsense():
    with pytest.raises(ValueError):
        FeedPolicy(capacity_s=0)
    with pytest.raises(ValueError):
        FeedPolicy(lead_s=-1)
