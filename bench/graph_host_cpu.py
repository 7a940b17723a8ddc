"""The graph executor's host code driven on a machine without a GPU: a wiring check for changes
to code that otherwise runs only on one (`gpu/engine/graph_executor.py`, `gpu/engine/graph/`).

torch.cuda is replaced by stand-ins that do nothing (events done at once, streams and pinned
memory plain, no graph captures: the executor runs its beats eagerly on one stream, as with
`capture=False, streams=False`), the model runs on the CPU with the Triton kernels in Triton's
interpreter, and the executor must equal the plain reference model: tokens equal, PCM within
1e-3. It says nothing of captures, streams, the wpk executor or timing: the GPU tests
(`pytest -m gpu`) do. About 10 minutes on two cores; exits non-zero on a mismatch.

    python3 bench/graph_host_cpu.py [--frames 6] [--beat-wait poll|thread]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import types
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
import torch                                                                 # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _on_cpu(device):
    return "cpu" if device is not None and str(device).startswith("cuda") else device


def stand_in_cuda() -> None:
    """torch.cuda's calls the executor makes, as no-ops on the CPU; tensors asked for on
    "cuda" or in pinned memory are plain CPU tensors."""
    for name in ("zeros", "full", "empty", "ones", "tensor"):
        real = getattr(torch, name)
        setattr(torch, name, lambda *a, _f=real, pin_memory=False, device=None, **k:
                _f(*a, device=_on_cpu(device), **k))
    torch.Tensor.pin_memory = lambda self: self
    to = torch.Tensor.to
    torch.Tensor.to = lambda self, *a, **k: to(
        self, *(_on_cpu(x) if isinstance(x, (str, torch.device)) else x for x in a),
        **({**k, "device": _on_cpu(k["device"])} if "device" in k else k))

    class Event:
        def __init__(self, *a, **k): pass
        def record(self, *a): pass
        def query(self): return True
        def synchronize(self): pass
        def elapsed_time(self, other): return 1.0

    class Stream:
        def __init__(self, *a, **k): pass
        def wait_stream(self, s): pass
        def wait_event(self, e): pass

    nothing = lambda *a, **k: contextlib.nullcontext()                  # noqa: E731
    for name, value in dict(
            is_available=lambda: True, is_initialized=lambda: True, Event=Event, Stream=Stream,
            current_stream=lambda *a: Stream(), stream=nothing, synchronize=lambda *a: None,
            mem_get_info=lambda *a: (60e9, 80e9), MemPool=lambda: types.SimpleNamespace(id=0),
            use_mem_pool=nothing, graph=nothing, memory_stats=lambda: {},
            memory_reserved=lambda: 0, get_device_name=lambda *a: "cpu stand-in",
            empty_cache=lambda: None, current_device=lambda: 0,
            is_current_stream_capturing=lambda: False,
            cudart=lambda: types.SimpleNamespace(cudaHostRegister=lambda *a: 0,
                                                 cudaHostUnregister=lambda *a: 0)).items():
        setattr(torch.cuda, name, value)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=6)
    ap.add_argument("--beat-wait", choices=("poll", "thread"), default="poll")
    args = ap.parse_args(argv)
    stand_in_cuda()
    from gpu.engine import graph_executor, indexed_graphs
    from gpu.engine.graph import beat_graphs
    from gpu.kernels import _check
    # padded rows share the trash slot, which the kernels' CPU-side checks refuse
    _check.check_slots.__code__ = (lambda slots, batch, max_slots, device: None).__code__
    indexed_graphs.IndexedGraphs.capture = lambda self, *a, **k: None   # resets run eagerly
    replay = beat_graphs.BeatGraphs._fastest_replay                     # one probe replay each
    beat_graphs.BeatGraphs._fastest_replay = lambda self, g, n, before=None: replay(
        self, g, 1, before)
    graph_executor.torch = types.SimpleNamespace(**{
        **{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")},
        "device": lambda *a: torch.device("cpu")})
    from tests.engine.test_engine_paths import parity
    from wave_actors.core.contract import ExecutorOptions

    ex = graph_executor.GraphExecutor(
        ExecutorOptions(max_sessions=5, profile="fp32", config="tiny", max_context=128,
                        beat_wait=args.beat_wait), capture=False, streams=False)
    print(f"built: buckets {ex.graphs.buckets()}, {ex.max_sessions} slots", flush=True)
    described = ex.describe()
    res = parity(ex, args.frames)           # asserts equal tokens; closes the executor
    print(f"parity over {args.frames} frames ({args.beat_wait}): tokens equal, pcm rel "
          f"{res['pcm_rel']:.2e}; {described['beats_run']} beats at build, "
          f"{ex.beats.beats_run} in all", flush=True)
    return 0 if res["pcm_rel"] < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
