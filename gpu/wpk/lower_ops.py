"""Argument records of `gpu.wpk.taskops` for the compiler's pointwise, copy, softmax, `bmm` and
convolution kernels (issue 18, stage 2): one aten node → one or more records, each with its
tiles. `gpu.wpk.lower` calls these for every kernel that is not a GEMM by a weight or a norm.

- Pointwise (the compiler leaves each node its own kernel when lowering, so a value between two
  nodes is written to its planned place): `EW` with the node's function; a Python number is a
  scalar operand; broadcasting is a stride of 0.
- Copies: `clone`, `copy_` and `_to_copy` copy; `index_select`, `gather` and `index` gather
  (an index term on A); `index_put_` and `index_copy_` scatter (index terms on out); `cat`
  and `stack` are a copy a piece, `constant_pad_nd` a copy of the inside and a fill of each
  border box (records over disjoint parts of the output, so its tiles never race);
  `arange` counts; `fill_`, `zero_`, `ones`, `zeros` and `full` fill.
- `_softmax` over dense last-dimension rows; `bmm` as `BGEMM`; `convolution` without padding
  or dilation: 1 × 1 of one group as `BGEMM` (positions × channels), one input channel a group
  as `CONV`.
- Refused (`Unsupported`, the kernel named): anything else, ranks above 4, a float to integer
  conversion, `index_put_` that accumulates, negative pads.
"""
from __future__ import annotations

import math
import struct

import torch

from gpu.wpk import taskops as X


class Unsupported(ValueError):
    """A kernel the task ops cannot run as it is."""


Tensor = tuple      # (offset, shape, strides): a value's place in the fp32 arena

UNARY = {"silu", "relu", "sigmoid", "neg", "exp", "tanh", "sqrt", "rsqrt", "glu", "abs"}
CLAMP = {"clamp", "clamp_min", "clamp_max"}
BINARY = {"add", "sub", "rsub", "mul", "div", "eq", "ne", "le", "lt", "ge", "gt", "remainder"}
BOOLEAN = {"bitwise_not": "not", "bitwise_or": "or", "bitwise_and": "and",
           "logical_not": "not", "logical_or": "or", "logical_and": "and"}


def f32_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", float(x)))[0]


def _rank4(shape: tuple, what: str) -> tuple:
    if len(shape) > 4:
        raise Unsupported(f"{what} of rank {len(shape)} (the task ops iterate over 4)")
    return (1,) * (4 - len(shape)) + tuple(shape)


def broadcast(t: Tensor, shape: tuple, what: str) -> tuple[int, list]:
    """(offset, 4 strides) of `t` read at every index of the iteration space `shape`."""
    off, tshape, tstride = t
    if len(tshape) > len(shape):
        raise Unsupported(f"{what} {tuple(tshape)} does not broadcast to {tuple(shape)}")
    pad = len(shape) - len(tshape)
    strides = [0] * pad
    for d, (n, s) in enumerate(zip(tshape, tstride)):
        if n == shape[pad + d]:
            strides.append(s if n > 1 else 0)
        elif n == 1:
            strides.append(0)
        else:
            raise Unsupported(f"{what} {tuple(tshape)} does not broadcast to {tuple(shape)}")
    return off, [0] * (4 - len(shape)) + strides


def ew(fn: str, shape: tuple, out: tuple, a=None, b=None, c=None, sa: float = 0.0,
       sb: float = 0.0, alpha: float = 1.0, terms=()) -> tuple[int, list, int]:
    """An EW record over iteration space `shape`: out/a/b/c are (offset, 4 strides) (None: a
    scalar, or no C); `terms` (target, idx offset, 4 strides, mult) with target 0 out, 1 A."""
    n = _rank4(shape, "an iteration space")
    rec = [X.EW_FN[fn], *n, out[0], *out[1]]
    for t in (a, b, c):
        rec += [-1, 0, 0, 0, 0] if t is None else [t[0], *t[1]]
    rec += [f32_bits(sa), f32_bits(sb), f32_bits(alpha)]
    terms = list(terms)
    if len(terms) > 3:
        raise Unsupported(f"{len(terms)} index terms (at most 3)")
    for t in terms + [(-1, 0, [0] * 4, 0)] * (3 - len(terms)):
        rec += [t[0], t[1], *t[2], t[3]]
    assert len(rec) == X.EW_WORDS
    return X.EW, rec, max(1, -(-math.prod(shape) // X.EW_TILE))


def dense(shape, stride) -> bool:
    """Row-major and contiguous (a dimension of one may have any stride)."""
    want = 1
    for n, s in zip(reversed(shape), reversed(stride)):
        if n > 1 and s != want:
            return False
        want *= n
    return True


class OpLowering:
    """Records for one kernel's node, (task op, record, tiles) each; `value(ref)` → (offset, shape, strides) in the arena
    (raises `Unsupported` for a value it cannot place), `dtype(ref)` its traced dtype."""

    def __init__(self, value, dtype, kernel: int):
        self.value, self.dtype, self.i = value, dtype, kernel

    def refuse(self, why: str):
        raise Unsupported(f"kernel {self.i}: {why}")

    def node(self, node) -> list[tuple[int, list, int]]:
        op = node.op
        try:
            if op in UNARY or op in BINARY or op in BOOLEAN or op in CLAMP or op in (
                    "masked_fill", "where"):
                return [self.pointwise(node)]
            handler = getattr(self, "op_" + op.strip("_"), None)
            if handler is None:
                self.refuse(f"{op} has no task op yet")
            return handler(node)
        except Unsupported as e:
            if str(e).startswith(f"kernel {self.i}:"):
                raise
            self.refuse(f"{op}: {e}")

    # pointwise ---------------------------------------------------------------------------
    def _operand(self, x, shape, what):
        if isinstance(x, (int, float, bool)):
            return None, float(x)
        if x is None:
            self.refuse(f"{what} is None")
        t = self.value(x, what)
        if len(t[1]) == 0:                   # a 0-dim tensor: broadcast from its one element
            return (t[0], [0] * 4), 0.0
        return broadcast(t, shape, what), 0.0

    def pointwise(self, node):
        op, out = node.op, self.value(node.outs[0], "the output")
        shape = out[1]
        o = broadcast(out, shape, "the output")
        alpha = float(node.kwargs.get("alpha", 1))
        if op in ("div",) and node.kwargs.get("rounding_mode") is not None:
            self.refuse(f"div with rounding_mode {node.kwargs['rounding_mode']!r}")
        if op in BOOLEAN:
            if any(self.dtype(r) != torch.bool for r in node.refs()):
                self.refuse(f"{op} of a non-boolean tensor (only booleans are 0/1 floats)")
            fn = BOOLEAN[op]
        else:
            fn = op
        if op == "masked_fill":                  # mask → value, else self
            x, mask, value = node.args
            b, _ = self._operand(x, shape, "the input")
            a, sa = self._operand(value, shape, "the value")
            c, _ = self._operand(mask, shape, "the mask")
            return ew("where", shape, o, a, b, c, sa=sa)
        if op == "where":
            cond, x, y = node.args
            a, sa = self._operand(x, shape, "x")
            b, sb = self._operand(y, shape, "y")
            c, _ = self._operand(cond, shape, "the condition")
            return ew("where", shape, o, a, b, c, sa=sa, sb=sb)
        if op == "glu":                          # A · σ(B), the two halves of dim
            x = self.value(node.args[0], "the input")
            dim = (node.args[1] if len(node.args) > 1 else -1) % len(x[1])
            half = x[1][dim] // 2
            view = (x[0], shape, x[2])
            gate = (x[0] + half * x[2][dim], shape, x[2])
            return ew("glu", shape, o, broadcast(view, shape, "the input"),
                      broadcast(gate, shape, "the gate"))
        if op in CLAMP:
            bounds = list(node.args[1:]) + [None, None]
            lo, hi = (bounds[0], bounds[1]) if op == "clamp" else (
                (bounds[0], None) if op == "clamp_min" else (None, bounds[0]))
            if not all(v is None or isinstance(v, (int, float)) for v in (lo, hi)):
                self.refuse(f"{op} by a tensor")
            a, _ = self._operand(node.args[0], shape, "the input")
            return ew("clamp", shape, o, a, sa=-math.inf if lo is None else lo,
                      sb=math.inf if hi is None else hi)
        a, sa = self._operand(node.args[0], shape, "the first operand")
        if op in BINARY or fn in ("or", "and"):
            b, sb = self._operand(node.args[1], shape, "the second operand")
        else:
            b, sb = None, 0.0
        return ew(fn, shape, o, a, b, sa=sa, sb=sb, alpha=alpha)

    # copies -------------------------------------------------------------------------------
    def _copy(self, src: Tensor, dst: Tensor):
        shape = dst[1]
        return ew("copy", shape, broadcast(dst, shape, "the output"),
                  broadcast(src, shape, "the source"))

    def op_clone(self, node):
        return [self._copy(self.value(node.args[0], "the source"),
                           self.value(node.outs[0], "the output"))]

    def op_to_copy(self, node):
        src = node.args[0]
        to = node.kwargs.get("dtype", self.dtype(src))
        if to is not None and not to.is_floating_point and self.dtype(src).is_floating_point:
            self.refuse(f"_to_copy from {self.dtype(src)} to {to} (no rounding op)")
        if to == torch.bool and self.dtype(src) != torch.bool:
            self.refuse(f"_to_copy from {self.dtype(src)} to bool")
        return self.op_clone(node)

    def op_copy(self, node):                    # copy_(dst, src)
        return [self._copy(self.value(node.args[1], "the source"),
                           self.value(node.args[0], "the destination"))]

    def op_fill(self, node):
        dst = self.value(node.args[0], "the destination")
        return [ew("copy", dst[1], broadcast(dst, dst[1], "the destination"),
                   sa=self._number(node.args[1], "fill_'s value"))]

    def _number(self, x, what: str) -> float:
        if not isinstance(x, (int, float, bool)):
            self.refuse(f"{what} is a tensor, not a number")
        return float(x)

    def op_zero(self, node):
        dst = self.value(node.args[0], "the destination")
        return [ew("copy", dst[1], broadcast(dst, dst[1], "the destination"))]

    def _full(self, node, value: float):
        out = self.value(node.outs[0], "the output")
        return [ew("copy", out[1], broadcast(out, out[1], "the output"), sa=value)]

    def op_ones(self, node):
        return self._full(node, 1.0)

    def op_zeros(self, node):
        return self._full(node, 0.0)

    def op_full(self, node):
        return self._full(node, self._number(node.args[1], "full's value"))

    def op_arange(self, node):
        nums = [a for a in node.args if isinstance(a, (int, float))]
        start, step = 0, 1
        if len(nums) >= 2:
            start = nums[0]
        if len(nums) == 3:
            step = nums[2]
        out = self.value(node.outs[0], "the output")
        return [ew("iota", out[1], broadcast(out, out[1], "the output"), sa=start, sb=step)]

    def _index(self, ref, shape: tuple, dims: list, what: str) -> tuple[int, list]:
        """An index tensor read at the iteration space `shape`: its dims lie at `dims`."""
        off, ishape, istride = self.value(ref, what)
        strides = [0] * len(shape)
        for d, n, s in zip(dims, ishape, istride):
            if n != shape[d] and n != 1:
                self.refuse(f"{what} {tuple(ishape)} does not fit {tuple(shape)}")
            strides[d] = s if n > 1 else 0
        return off, [0] * (4 - len(shape)) + strides

    def _gather(self, src: Tensor, out: Tensor, dim: int, idx_dims: list, idx_ref):
        shape = out[1]
        dim %= len(src[1])
        s_off, s_shape, s_stride = src
        # A at the output's index, its `dim` taken from the index tensor
        view = (s_off, tuple(shape), tuple(0 if d == dim else s for d, s in enumerate(s_stride)))
        a = broadcast(view, shape, "the source") if len(s_shape) == len(shape) else None
        if a is None:
            self.refuse(f"a gather from rank {len(s_shape)} into rank {len(shape)}")
        i_off, i_str = self._index(idx_ref, shape, idx_dims, "the index")
        return ew("copy", shape, broadcast(out, shape, "the output"), a,
                  terms=[(1, i_off, i_str, s_stride[dim])])

    def op_index_select(self, node):
        src, dim, idx = node.args
        src_t, out = self.value(src, "the source"), self.value(node.outs[0], "the output")
        return [self._gather(src_t, out, dim, [dim % len(out[1])], idx)]

    def op_gather(self, node):
        src, dim, idx = node.args[:3]
        out = self.value(node.outs[0], "the output")
        return [self._gather(self.value(src, "the source"), out, dim, list(range(len(out[1]))),
                             idx)]

    def op_index(self, node):
        src, indices = node.args
        if len(indices) != 1 or indices[0] is None or len(self.value(indices[0], "idx")[1]) != 1:
            self.refuse("index by more than one 1-D index tensor")
        out = self.value(node.outs[0], "the output")
        return [self._gather(self.value(src, "the source"), out, 0, [0], indices[0])]

    def _scatter(self, dst: Tensor, src: Tensor, shape: tuple, indexed: list):
        """dst at the iteration space `shape` with dims `indexed` [(dim, idx ref, its dims)]
        taken from index tensors; A = src broadcast."""
        d_off, d_shape, d_stride = dst
        stride = list(d_stride)
        terms = []
        for dim, ref, dims in indexed:
            i_off, i_str = self._index(ref, shape, dims, "an index")
            terms.append((0, i_off, i_str, stride[dim]))
            stride[dim] = 0
        o = (d_off, [0] * (4 - len(shape)) + stride)
        if len(d_shape) != len(shape):
            self.refuse(f"a scatter of rank {len(shape)} into rank {len(d_shape)}")
        return ew("copy", shape, o, broadcast(src, shape, "the values"), terms=terms)

    def op_index_put(self, node):
        dst, indices, values = node.args[:3]
        if (node.args[3:] and node.args[3]) or node.kwargs.get("accumulate"):
            self.refuse("index_put_ that accumulates")
        if any(i is None for i in indices):
            self.refuse("index_put_ with a skipped dimension")
        dst_t = self.value(dst, "the destination")
        shapes = [self.value(i, "an index")[1] for i in indices]
        lead = tuple(torch.broadcast_shapes(*[torch.Size(s) for s in shapes]))
        shape = lead + tuple(dst_t[1][len(indices):])
        indexed = []
        for dim, (ref, s) in enumerate(zip(indices, shapes)):
            indexed.append((dim, ref, list(range(len(lead) - len(s), len(lead)))))
        return [self._scatter(dst_t, self.value(values, "the values"), shape, indexed)]

    def op_index_copy(self, node):
        dst, dim, idx, src = node.args
        src_t = self.value(src, "the source")
        dim %= len(src_t[1])
        return [self._scatter(self.value(dst, "the destination"), src_t, src_t[1],
                              [(dim, idx, [dim])])]

    def _pieces(self, refs, out: Tensor, dim: int, new_dim: bool):
        o_off, o_shape, o_stride = out
        recs, at = [], 0
        for ref in refs:
            t = self.value(ref, "a piece")
            shape = t[1]
            if new_dim:
                stride = tuple(s for d, s in enumerate(o_stride) if d != dim)
                piece = (o_off + at * o_stride[dim], shape, stride)
                at += 1
            else:
                piece = (o_off + at * o_stride[dim], shape, o_stride)
                at += shape[dim]
            if math.prod(shape):
                recs.append(self._copy(t, piece))
        return recs

    def op_cat(self, node):
        refs, dim = node.args[0], (node.args[1] if len(node.args) > 1 else 0)
        out = self.value(node.outs[0], "the output")
        return self._pieces(refs, out, dim % len(out[1]), False)

    def op_stack(self, node):
        refs, dim = node.args[0], (node.args[1] if len(node.args) > 1 else 0)
        out = self.value(node.outs[0], "the output")
        return self._pieces(refs, out, dim % len(out[1]), True)

    def op_constant_pad_nd(self, node):
        x, pad = node.args[:2]
        value = float(node.args[2]) if len(node.args) > 2 else 0.0
        if any(p < 0 for p in pad):
            self.refuse(f"negative pads {list(pad)}")
        src, out = self.value(x, "the input"), self.value(node.outs[0], "the output")
        o_off, shape, o_stride = out
        lo = [0] * len(shape)
        for j in range(len(pad) // 2):
            lo[len(shape) - 1 - j] = pad[2 * j]
        inner = src[1]
        inside = (o_off + sum(l * s for l, s in zip(lo, o_stride)), inner, o_stride)
        recs = [self._copy(src, inside)]
        # border boxes: dim d outside [lo, lo + inner), dims before d inside, dims after all
        for d in range(len(shape)):
            for start, size in ((0, lo[d]), (lo[d] + inner[d], shape[d] - lo[d] - inner[d])):
                if size <= 0:
                    continue
                box = [inner[k] if k < d else shape[k] for k in range(len(shape))]
                box[d] = size
                first = [lo[k] if k < d else 0 for k in range(len(shape))]
                first[d] = start
                at = o_off + sum(f * s for f, s in zip(first, o_stride))
                recs.append(ew("copy", tuple(box),
                               broadcast((at, tuple(box), o_stride), tuple(box), "a border"),
                               sa=value))
        return recs

    # softmax, bmm, convolution ------------------------------------------------------------
    def op_softmax(self, node):
        x, dim = node.args[:2]
        xt, yt = self.value(x, "the input"), self.value(node.outs[0], "the output")
        if dim % len(xt[1]) != len(xt[1]) - 1 or not (dense(*xt[1:]) and dense(*yt[1:])):
            self.refuse("a softmax that is not over dense rows")
        d = xt[1][-1]
        if d > X.SM_MAX_D:
            self.refuse(f"softmax rows of {d} (at most {X.SM_MAX_D})")
        rows = math.prod(xt[1][:-1])
        return [(X.SOFTMAX, [xt[0], yt[0], rows, d], -(-rows // X.SM_TILE_M))]

    @staticmethod
    def _bgemm(a, b, c, nb, m, n, k, bias=(-1, 0, 0)):
        """A BGEMM record; products of one row block (M ≤ the tile's) run `BG_BATCHES` batches
        a tile."""
        per_tile = X.BG_BATCHES if m <= X.BG_TILE_M else 1
        rec = [*a, *b, *c, nb, m, n, k, *bias, per_tile]
        assert len(rec) == X.BGEMM_WORDS
        return X.BGEMM, rec, -(-nb // per_tile) * -(-m // X.BG_TILE_M) * -(-n // X.BG_TILE_N)

    def op_bmm(self, node):
        (a_off, (nb, m, k), sa), (b_off, (_, _, n), sb) = (self.value(r, w) for r, w in zip(
            node.args, ("A", "B")))
        c_off, _, sc = self.value(node.outs[0], "the output")
        return [self._bgemm([a_off, *sa], [b_off, *sb], [c_off, *sc], nb, m, n, k)]

    def op_convolution(self, node):
        x, w, bias, stride, padding, dilation, transposed, _, groups = node.args
        if transposed or any(padding) or any(d != 1 for d in dilation):
            self.refuse("a convolution with padding, dilation or transposed")
        xt, wt = self.value(x, "the input"), self.value(w, "the weight")
        yt = self.value(node.outs[0], "the output")
        if not dense(*yt[1:]) or not dense(*wt[1:]):
            self.refuse("a convolution whose output or weight is not dense")
        b = self.value(bias, "the bias")[0] if bias is not None else -1
        if len(xt[1]) == 3:                      # 1-D: one row of height 1
            xt = (xt[0], (xt[1][0], xt[1][1], 1, xt[1][2]), (xt[2][0], xt[2][1], 0, xt[2][2]))
            wt = (wt[0], (wt[1][0], wt[1][1], 1, wt[1][2]), None)
            yt = (yt[0], (yt[1][0], yt[1][1], 1, yt[1][2]), None)
            stride = (1, *stride)
        (nb, ci, h, wd), (sn, sc, sh, sw) = xt[1], xt[2]
        co, cig, kh, kw = wt[1]
        _, _, ho, wo = yt[1]
        if (kh, kw) == (1, 1) and groups == 1 and tuple(stride) == (1, 1) and sh == wd * sw:
            # positions × channels: A[n][p, ci] = x, B[n][ci, co] = w[co, ci]
            return [self._bgemm([xt[0], sn, sw, sc], [wt[0], 0, 1, ci], [yt[0], co * ho * wo, 1,
                                ho * wo], nb, h * wd, co, ci, (b, 0, 1))]
        if cig != 1:
            self.refuse(f"a convolution of {cig} input channels a group")
        rec = [xt[0], sn, sc, sh, sw, wt[0], b, yt[0], nb, co, ho, wo, kh, kw, stride[0],
               stride[1], co // ci]
        return [(X.CONV, rec, -(-nb * co * ho * wo // X.CONV_TILE))]
