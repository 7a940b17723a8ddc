"""A tensor IR of one stage of the decode path (issue 18, stage 2): traced once, as aten ops, with
a symbolic batch, dtypes and storage classes. What the compiler's passes (fusion onto the kernel
library, tiling, dependency counters, the static schedule) will read; this module holds the IR,
its trace, the batch made symbolic, and a replay that proves the IR is the whole computation.

- `trace(fn, named)` runs `fn()` under a dispatch mode and records every aten op: its overload,
  its arguments (tensors as value references, everything else as constants), its outputs, and
  which storages it reads and writes (from the op's schema: `index_copy_` writes its first
  argument). Views are nodes too (`Node.view`): they launch nothing but share storage.
- Storages are classed by where they come from: `named` maps names to the tensors the caller
  knows, each with its class (WEIGHT, STATE, INPUT); a storage an op allocates is an
  ACTIVATION; one that existed before the trace but was not named is CONSTANT (a buffer the
  model made at load, such as a position table); the values `fn` returns are OUTPUT.
- `symbolic(a, b)`: two traces of the same stage at two batches, matched op for op; every
  shape, byte count and integer argument that differs is fitted as `per_b * B + fixed` (a
  `Dim`), and must be integral. A stage whose op sequence changes with the batch is refused.
- `replay(graph, tensors)` runs the recorded ops on real tensors: on the CPU it equals running
  `fn` bit for bit, which a missing op or a miswired argument would break.

Traced on the meta device (shapes only) for the full model; on the CPU for the replay tests.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten


class Storage(enum.Enum):
    WEIGHT = "weight"
    STATE = "slot state"
    INPUT = "input"
    OUTPUT = "output"
    ACTIVATION = "activation"
    CONSTANT = "constant"


@dataclass(frozen=True)
class Dim:
    """An extent `per_b * B + fixed` for a batch of B sessions."""
    per_b: int
    fixed: int

    def at(self, batch: int) -> int:
        return self.per_b * batch + self.fixed

    def __repr__(self) -> str:
        if not self.per_b:
            return str(self.fixed)
        b = "B" if self.per_b == 1 else f"{self.per_b}B"
        return b if not self.fixed else f"{b}{self.fixed:+d}"


def at(x: Any, batch: int) -> Any:
    """`x` (an int, a Dim, or a nest of them) at a batch of `batch`."""
    return tree_map(lambda v: v.at(batch) if isinstance(v, Dim) else v, x)


@dataclass(frozen=True)
class Ref:
    """A tensor argument: the IR value it is."""
    value: int


@dataclass
class Value:
    shape: tuple
    stride: tuple
    offset: Any
    dtype: torch.dtype
    storage: int


@dataclass
class StorageInfo:
    kind: Storage
    nbytes: Any
    name: str = ""


@dataclass
class Node:
    op: str
    func: Any                       # the aten OpOverload
    args: tuple
    kwargs: dict
    outs: list                      # Ref or None per returned item (flattened)
    reads: set = field(default_factory=set)      # storage ids
    writes: set = field(default_factory=set)
    view: bool = False

    def refs(self) -> list[Ref]:
        """Its tensor arguments."""
        return [r for r in tree_flatten((self.args, self.kwargs))[0] if isinstance(r, Ref)]


@dataclass
class Graph:
    nodes: list
    values: list
    storages: list
    named: dict                     # name → value id
    outputs: list                   # value ids
    batch: Any = None               # the batch traced, or "B" once symbolic
    held: dict = field(default_factory=dict)    # CONSTANT value id → the tensor traced
    fp32_arena: bool = False        # storages not floating point sized as fp32 elements

    def storages_of(self, kind: Storage) -> list[int]:
        return [i for i, s in enumerate(self.storages) if s.kind is kind]

    def bytes_of(self, kind: Storage, batch: int | None = None) -> int:
        return sum(at(self.storages[i].nbytes, batch) if batch is not None
                   else self.storages[i].nbytes for i in self.storages_of(kind))

    def launches(self) -> int:
        return sum(1 for n in self.nodes if not n.view)


def _is_view(func) -> bool:
    """Launches nothing: returns an alias of an input (`_unsafe_view` is one without saying so)."""
    return func.overloadpacket.__name__ == "_unsafe_view" or any(
        r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def _written_args(func) -> list[int]:
    return [i for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write]


class _Tracer(TorchDispatchMode):
    def __init__(self, named: dict[str, tuple[Storage, torch.Tensor]]):
        super().__init__()
        self.values: list[Value] = []
        self.storages: list[StorageInfo] = []
        self.nodes: list[Node] = []
        self._by_tensor: dict[int, int] = {}          # id(tensor) → value id
        self._keep: list[torch.Tensor] = []           # ids stay unique while traced
        self._by_storage: dict[StorageWeakRef, int] = {}
        self.named: dict[str, int] = {}
        for name, (kind, t) in named.items():
            self.named[name] = self._value(t, kind, name)

    def _storage(self, t: torch.Tensor, kind: Storage, name: str = "") -> int:
        key = StorageWeakRef(t.untyped_storage())
        sid = self._by_storage.get(key)
        if sid is None:
            sid = self._by_storage[key] = len(self.storages)
            self.storages.append(StorageInfo(kind, t.untyped_storage().nbytes(), name))
        return sid

    def _value(self, t: torch.Tensor, kind: Storage, name: str = "") -> int:
        vid = self._by_tensor.get(id(t))
        if vid is not None:
            return vid
        sid = self._storage(t, kind, name)
        vid = len(self.values)
        self.values.append(Value(tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype,
                                 sid))
        self._by_tensor[id(t)] = vid
        self._keep.append(t)
        return vid

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ref = lambda x: Ref(self._value(x, Storage.CONSTANT)) if isinstance(x, torch.Tensor) else x  # noqa: E731
        node = Node(func.overloadpacket.__name__, func, tree_map(ref, args),
                    tree_map(ref, kwargs), [], view=_is_view(func))
        reads = {self.values[r.value].storage for r in node.refs()}
        writes = set()
        for i in _written_args(func):
            if i < len(node.args) and isinstance(node.args[i], Ref):
                writes.add(self.values[node.args[i].value].storage)
        for name, v in node.kwargs.items():             # out= arguments
            if name == "out" and isinstance(v, Ref):
                writes.add(self.values[v.value].storage)
        flat_out, _ = tree_flatten(out)
        outs = [Ref(self._value(o, Storage.ACTIVATION)) if isinstance(o, torch.Tensor) else None
                for o in flat_out]
        fresh = {self.values[r.value].storage for r in outs if r is not None} - reads
        node.outs, node.reads, node.writes = outs, reads, writes | fresh
        self.nodes.append(node)
        return out


def trace(fn: Callable[[], Any], named: dict[str, tuple[Storage, torch.Tensor]]) -> Graph:
    """The IR of `fn()`; `named`: name → (class, tensor) of the weights, slot state and inputs
    it uses. What `fn` returns (tensors, or a nest of them) are the outputs."""
    tracer = _Tracer(named)
    with torch.no_grad(), tracer:
        result = fn()
    outputs = []
    for t in tree_flatten(result)[0]:
        if isinstance(t, torch.Tensor):
            vid = tracer._value(t, Storage.ACTIVATION)
            outputs.append(vid)
            info = tracer.storages[tracer.values[vid].storage]
            if info.kind is Storage.ACTIVATION:
                info.kind = Storage.OUTPUT
    held = {}
    for t in tracer._keep:
        vid = tracer._by_tensor[id(t)]
        if tracer.storages[tracer.values[vid].storage].kind is Storage.CONSTANT:
            held[vid] = t
    return Graph(tracer.nodes, tracer.values, tracer.storages, tracer.named, outputs, None, held)


def _fit(x1: Any, x2: Any, b1: int, b2: int, where: str) -> Any:
    """What is equal at both batches stays; integers that differ become a Dim."""
    if x1 == x2 and type(x1) is type(x2):
        return x1
    if type(x1) is int and type(x2) is int:
        per_b, rest = divmod(x2 - x1, b2 - b1)
        if rest:
            raise ValueError(f"{where}: {x1} at B={b1}, {x2} at B={b2}: not an integer number "
                             "per session")
        return Dim(per_b, x1 - per_b * b1)
    raise ValueError(f"{where}: {x1!r} at B={b1} and {x2!r} at B={b2} differ")


def _fit_nest(a: Any, b: Any, b1: int, b2: int, where: str) -> Any:
    fa, spec_a = tree_flatten(a)
    fb, spec_b = tree_flatten(b)
    if spec_a != spec_b:
        raise ValueError(f"{where}: the arguments' structure changes with the batch")
    return tree_unflatten([_fit(x, y, b1, b2, where) for x, y in zip(fa, fb)], spec_a)


def symbolic(g1: Graph, b1: int, g2: Graph, b2: int) -> Graph:
    """The IR with its batch symbolic, from traces at batches b1 and b2 (b1 != b2)."""
    if len(g1.nodes) != len(g2.nodes) or any(
            x.op != y.op for x, y in zip(g1.nodes, g2.nodes)):
        raise ValueError("the stage's ops change with the batch: no symbolic batch")
    if len(g1.values) != len(g2.values) or len(g1.storages) != len(g2.storages):
        raise ValueError("the stage's tensors change with the batch: no symbolic batch")
    values = [dataclasses.replace(
        v, shape=tuple(_fit(a, b, b1, b2, f"value {i} shape") for a, b in zip(v.shape, w.shape)),
        stride=tuple(_fit(a, b, b1, b2, f"value {i} stride") for a, b in zip(v.stride, w.stride)),
        offset=_fit(v.offset, w.offset, b1, b2, f"value {i} offset"))
        for i, (v, w) in enumerate(zip(g1.values, g2.values))]
    storages = [dataclasses.replace(s, nbytes=_fit(s.nbytes, t.nbytes, b1, b2, f"storage {i}"))
                for i, (s, t) in enumerate(zip(g1.storages, g2.storages))]
    nodes = [dataclasses.replace(
        n, args=_fit_nest(n.args, m.args, b1, b2, f"node {i} ({n.op})"),
        kwargs=_fit_nest(n.kwargs, m.kwargs, b1, b2, f"node {i} ({n.op})"))
        for i, (n, m) in enumerate(zip(g1.nodes, g2.nodes))]
    return Graph(nodes, values, storages, dict(g1.named), list(g1.outputs), "B", dict(g1.held))


class Runner:
    """Runs recorded nodes on real tensors: `env` maps value ids to tensors (the CONSTANT ones
    as traced, the named ones as given); a symbolic graph runs at `batch`, and a traced op's
    device arguments become `device`."""

    def __init__(self, graph: Graph, tensors: dict[str, torch.Tensor], batch: int | None = None,
                 device: torch.device | str = "cpu"):
        self.graph, self.batch, self.device = graph, batch, torch.device(device)
        self.env: dict[int, torch.Tensor] = dict(graph.held)
        self.env.update({graph.named[k]: t for k, t in tensors.items()})

    def _resolve(self, x):
        if isinstance(x, Ref):
            return self.env[x.value]
        if isinstance(x, Dim):
            return x.at(self.batch)
        if isinstance(x, torch.device):
            return self.device
        return x

    def ready(self, k: int) -> bool:
        """Whether every tensor node `k` takes is bound."""
        return all(r.value in self.env for r in self.graph.nodes[k].refs())

    def run(self, k: int, place: Callable[[int, torch.Tensor], torch.Tensor] | None = None
            ) -> None:
        """Node `k`, its results bound (a value bound already keeps its tensor: an in-place op
        returns its input); `place(value, tensor)` may put a fresh result elsewhere first."""
        node = self.graph.nodes[k]
        out = node.func(*tree_map(self._resolve, node.args),
                        **tree_map(self._resolve, node.kwargs))
        for ref, t in zip(node.outs, tree_flatten(out)[0]):
            if ref is not None and ref.value not in self.env:
                self.env[ref.value] = t if place is None else place(ref.value, t)

    def outputs(self) -> list[torch.Tensor]:
        return [self.env[v] for v in self.graph.outputs]


def replay(graph: Graph, tensors: dict[str, torch.Tensor], batch: int | None = None,
           device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """Runs the recorded ops in order on `tensors` (see `Runner`) and returns the outputs."""
    runner = Runner(graph, tensors, batch, device)
    with torch.no_grad():
        for k in range(len(graph.nodes)):
            runner.run(k)
    return runner.outputs()
