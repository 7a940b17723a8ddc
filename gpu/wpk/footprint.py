"""Where a run of a task op's tiles reads and writes the fp32 arena (issue 18, stage 2): the
addresses behind tile-level dependency counters (`gpu.wpk.tilecounters`).

`ranges(op, record, t0, t1, storage_of)` gives, for tiles t0..t1-1 of one argument record,
(reads, writes): lists of half-open element ranges [lo, hi) of the arena. Each range is a hull
(every address the tiles touch lies inside it, some inside may not be touched), so an ordering
built on overlapping hulls is sound, only sometimes stricter than needed. The ranges follow the
tile bodies of `gpu.wpk.taskrun` (GEMM, ADD_LN) and `gpu.wpk.taskops` (EW, SOFTMAX, BGEMM,
CONV) word for word; an address a body computes from data (an index term's `mult · idx`)
cannot be bounded from the record, so that operand's range is the whole storage holding its
base, which `storage_of(address)` gives. The weight arena is never written and is not here.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from gpu.wpk import taskops as X
from gpu.wpk import taskrun as T

Range = tuple[int, int]


def box(first: int, end: int, extents: tuple) -> list[Range] | None:
    """Per dimension, the index range [lo, hi) that the row-major linear indices first..end-1
    of `extents` cover (a hull: once the first and last index differ in a dimension, every
    inner dimension is whole); None when the range is empty."""
    if end <= first:
        return None
    index = np.unravel_index([first, end - 1], extents)      # per dimension: first, last
    ranges, fixed = [], True
    for d, n in enumerate(extents):
        a, b = int(index[d][0]), int(index[d][1])
        ranges.append((a, b + 1) if fixed else (0, int(n)))
        fixed = fixed and a == b
    return ranges


def hull(offset: int, dims: list[tuple[int, int, int]]) -> Range | None:
    """The addresses offset + Σ i_d · stride_d over i_d in [lo_d, hi_d), as one range (strides
    of any sign); None when a dimension is empty."""
    lo = hi = offset
    for a, b, stride in dims:
        if b <= a:
            return None
        ends = (a * stride, (b - 1) * stride)
        lo += min(ends)
        hi += max(ends)
    return lo, hi + 1


def _rows(offset: int, r0: int, r1: int, width: int) -> Range | None:
    return hull(offset, [(r0, r1, width), (0, width, 1)])


def _tiles_rows(t0: int, t1: int, per_tile: int, rows: int) -> tuple[int, int]:
    return t0 * per_tile, min(rows, t1 * per_tile)


def _gemm(rec, t0, t1, _storage_of):
    x, _w, b, y, m, n, k, _act, _scale, splits = (int(v) for v in rec[:10])
    tiles_n = -(-n // T.GEMM_TILE_N)
    tiles = np.arange(t0, t1)
    mt = (tiles // splits) // tiles_n
    r0, r1 = int(mt.min()) * T.GEMM_TILE_M, min(m, (int(mt.max()) + 1) * T.GEMM_TILE_M)
    reads = [_rows(x, r0, r1, k)] + ([(b, b + n)] if b >= 0 else [])
    writes = [_rows(y + s * m * n, r0, r1, n) for s in sorted(set((tiles % splits).tolist()))]
    return reads, writes


def _add_ln(rec, t0, t1, _storage_of):
    x, r, g, beta, s_out, y, m, d, _alpha, r_splits = (int(v) for v in rec[:10])
    inner, s0, s1, sd = (int(v) for v in rec[10:14])
    r0, r1 = _tiles_rows(t0, t1, T.LN_TILE_M, m)
    if r1 <= r0:
        return [], []
    if inner > 0:
        rows = np.arange(r0, r1)
        bases = (rows // inner) * s0 + (rows % inner) * s1
        last = (d - 1) * sd
        x_range = (x + int(bases.min()) + min(0, last), x + int(bases.max()) + max(0, last) + 1)
    else:
        x_range = _rows(x, r0, r1, d)
    reads = [x_range, (g, g + d), (beta, beta + d)]
    if r >= 0:
        reads += [_rows(r + j * m * d, r0, r1, d) for j in range(r_splits)]
    writes = [_rows(y, r0, r1, d)] + ([_rows(s_out, r0, r1, d)] if s_out >= 0 else [])
    return reads, writes


def _ew(rec, t0, t1, storage_of):
    fn = int(rec[0])
    extents = tuple(int(v) for v in rec[1:5])
    total = int(np.prod(extents))
    space = box(t0 * X.EW_TILE, min(total, t1 * X.EW_TILE), extents)
    if space is None:
        return [], []
    terms = [[int(v) for v in rec[X.EW_TERMS + 7 * j: X.EW_TERMS + 7 * j + 7]] for j in range(3)]
    indexed = {t[0] for t in terms if t[0] >= 0}
    reads = [hull(t[1], [(a, b, s) for (a, b), s in zip(space, t[2:6])])
             for t in terms if t[0] >= 0]

    def operand(base: int, which: int) -> Range | None:
        offset, strides = int(rec[base]), [int(v) for v in rec[base + 1: base + 5]]
        if offset < 0:
            return None
        if which in indexed:            # its address moves with data: the whole storage
            return storage_of(offset)
        return hull(offset, [(a, b, s) for (a, b), s in zip(space, strides)])
    if fn != X.EW_FN["iota"]:
        reads += [operand(base, which) for base, which in ((X.EW_A, 1), (X.EW_B, 2),
                                                           (X.EW_C, 3))]
    return reads, [operand(X.EW_OUT, 0)]


def _softmax(rec, t0, t1, _storage_of):
    x, y, m, d = (int(v) for v in rec[:4])
    r0, r1 = _tiles_rows(t0, t1, X.SM_TILE_M, m)
    return [_rows(x, r0, r1, d)], [_rows(y, r0, r1, d)]


def _bgemm(rec, t0, t1, _storage_of):
    (a, a_sb, a_sm, a_sk, b, b_sb, b_sk, b_sn, c, c_sb, c_sm, c_sn, batches, m, n, k, bias,
     bias_sm, bias_sn, per_tile) = (int(v) for v in rec[:X.BGEMM_WORDS])
    tiles_m, tiles_n = -(-m // X.BG_TILE_M), -(-n // X.BG_TILE_N)
    tiles = np.arange(t0, t1)
    groups, t = tiles // (tiles_m * tiles_n), tiles % (tiles_m * tiles_n)
    bt = (int(groups.min()) * per_tile, min(batches, (int(groups.max()) + 1) * per_tile))
    mt, nt = t // tiles_n, t % tiles_n
    rm = (int(mt.min()) * X.BG_TILE_M, min(m, (int(mt.max()) + 1) * X.BG_TILE_M))
    rn = (int(nt.min()) * X.BG_TILE_N, min(n, (int(nt.max()) + 1) * X.BG_TILE_N))
    reads = [hull(a, [(*bt, a_sb), (*rm, a_sm), (0, k, a_sk)]),
             hull(b, [(*bt, b_sb), (0, k, b_sk), (*rn, b_sn)])]
    if bias >= 0:
        reads.append(hull(bias, [(*rm, bias_sm), (*rn, bias_sn)]))
    return reads, [hull(c, [(*bt, c_sb), (*rm, c_sm), (*rn, c_sn)])]


def _conv(rec, t0, t1, _storage_of):
    (x, x_sn, x_sc, x_sh, x_sw, w, bias, y, n_batch, co_n, ho, wo, kh, kw, sh, sw,
     co_per_ci) = (int(v) for v in rec[:X.CONV_WORDS])
    total = n_batch * co_n * ho * wo
    first, end = t0 * X.CONV_TILE, min(total, t1 * X.CONV_TILE)
    space = box(first, end, (n_batch, co_n, ho, wo))
    if space is None:
        return [], []
    (n0, n1), (c0, c1), (h0, h1), (w0, w1) = space
    reads = [hull(x, [(n0, n1, x_sn), (c0 // co_per_ci, (c1 - 1) // co_per_ci + 1, x_sc),
                      (h0 * sh, (h1 - 1) * sh + kh, x_sh), (w0 * sw, (w1 - 1) * sw + kw, x_sw)]),
             (w + c0 * kh * kw, w + c1 * kh * kw)]
    if bias >= 0:
        reads.append((bias + c0, bias + c1))
    return reads, [(y + first, y + end)]


_BY_OP = {T.GEMM: _gemm, T.ADD_LN: _add_ln, X.EW: _ew, X.SOFTMAX: _softmax, X.BGEMM: _bgemm,
          X.CONV: _conv}


def ranges(op: int, rec, t0: int, t1: int, storage_of: Callable[[int], Range]
           ) -> tuple[list[Range], list[Range]]:
    """(reads, writes) of tiles t0..t1-1 of a record of task op `op` (see the module's
    docstring); empty ranges are left out."""
    if t1 <= t0:
        return [], []
    reads, writes = _BY_OP[op](rec, t0, t1, storage_of)
    return [r for r in reads if r is not None and r[1] > r[0]], \
        [r for r in writes if r is not None and r[1] > r[0]]
