"""RowPool, the clock's reused buffers for a beat's routed PCM rows: a row a session still holds
is never overwritten, and a buffer nobody holds is reused instead of allocating (the point)."""
import numpy as np
from hypothesis import given, settings, strategies as st

from wave_actors.clock.routes import RowPool

SRC_SHAPE = (9, 2, 5)


def src(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SRC_SHAPE).astype(np.float32)


def test_rows_are_copied_and_a_released_buffer_is_reused():
    pool = RowPool(keep=4)
    a = src(0)
    got = pool.take(a, [3, 0, 7])
    np.testing.assert_array_equal(got, a[[3, 0, 7]])
    first = got.ctypes.data              # the address only: a reference would hold the buffer
    del got
    again = pool.take(src(1), [1, 2])
    assert again.ctypes.data == first, "a buffer no one holds must be reused"
    assert len(pool._bufs) == 1
    np.testing.assert_array_equal(again, src(1)[[1, 2]])


def assert_unchanged(held: list) -> None:
    for view, want in held:
        np.testing.assert_array_equal(view, want)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, SRC_SHAPE[0] - 1), max_size=SRC_SHAPE[0], unique=True),
                          st.booleans()), min_size=1, max_size=20),
       st.integers(1, 4))
def test_a_held_row_keeps_its_values_whatever_comes_after(beats, keep):
    """Invariant: every row view a session still holds equals what was routed to it, however
    many beats reuse the pool after it; the pool never holds more than `keep` buffers."""
    pool, held = RowPool(keep=keep), []
    for beat, (rows, hold) in enumerate(beats):
        a = src(beat)
        out = pool.take(a, rows)
        if hold:
            held += [(out[i], a[r].copy()) for i, r in enumerate(rows)]
        del out
        assert_unchanged(held)
        assert len(pool._bufs) <= keep
        assert pool.held <= len(pool._bufs)
    held.clear()
    assert pool.held == 0


def test_reuse_follows_the_rows_lifetimes_not_reference_counts():
    """The pool decided a buffer was free from `sys.getrefcount(buf) == 3`, a number CPython
    versions count differently (3.14 borrows references it used to count): a reference the
    interpreter holds, or stops holding, then reads as a row in use, or as none. Here another
    reference to the buffer itself (as a debugger or a newer interpreter's frame would hold)
    must not stop its reuse once the rows are gone, and a view of a view of a row must keep it."""
    pool = RowPool(keep=2)
    got = pool.take(src(0), [0, 1, 2])
    inner = got[1][0][::2]                   # a view of a view of a row
    want = inner.copy()
    del got
    other = pool.take(src(1), [4, 5])        # the first buffer is still held by `inner`
    np.testing.assert_array_equal(inner, want)
    assert pool.held == 2
    extra = pool._bufs[0]                    # a reference that is no row
    del inner, other
    assert pool.held == 0
    again = pool.take(src(2), [3])
    assert again.ctypes.data in (b.ctypes.data for b in pool._bufs) and extra is pool._bufs[0]
