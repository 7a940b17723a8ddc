"""Compile the wpk probes for sm_90 without a GPU: Triton's own compiler to PTX and
its bundled ptxas for registers and spills. What CI can check of the device code on a CPU: the
synchronisation compiled to the instructions meant (acquire loads, release atomics and stores,
the backoff sleep, the GPU clock), and a register budget kept with no spills.

    TRITON_INTERPRET=0 python -m bench.harness.wpk_compile_check [--json]

Must run without TRITON_INTERPRET=1 (under the interpreter `@triton.jit` gives no compiler
input); the tests call it in a subprocess.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

REG_BUDGET = 64          # a controller or a probe must leave room for the kernels beside it


def budget(name: str) -> int:
    return REG_BUDGET

# [module:]kernel of gpu.wpk (bench.harness.wpk_probes without a module) → (signature, constexprs, instructions its
# PTX must hold)
PROBES = {
    "chain": ({"values": "*i32", "counters": "*i32", "out": "*i32", "n_programs": "i32"},
              {}, ("ld.global.acquire.gpu.b32", "nanosleep.u32", "atom.global.gpu.release.add",
                   "bar.sync")),
    "rounds": ({"counter": "*i32", "slots": "*i32", "out": "*i32", "n_programs": "i32",
                "n_rounds": "i32"},
               {"BLOCK": 8}, ("ld.global.acquire.gpu.b32", "atom.global.gpu.release.add")),
    "doorbell": ({"bell": "*i64", "ack": "*i64", "stamps": "*i64", "n_beats": "i32"},
                 {}, ("ld.global.acquire.sys.b64", "st.global.release.sys.b64",
                      "%globaltimer")),
    # The resident controller (gpu.wpk.mailbox), alone and with its stand-in lanes.
    "mailbox:controller": ({"box": "*i64", "work": "*i32", "args": "*i32", "frame_ctr": "*i32",
                            "n_lanes": "i32", "first_seq": "i32", "runs": "i32",
                            "timeout_ns": "i64"},
                           {}, ("ld.global.acquire.sys.b64", "st.global.release.sys.b64",
                                "ld.global.acquire.gpu.b32", "atom.global.gpu.release.exch",
                                "%globaltimer", "nanosleep.u32")),
    "mailbox:controller_and_lanes": ({"box": "*i64", "work": "*i32", "args": "*i32",
                                      "frame_ctr": "*i32", "out": "*i32", "n_lanes": "i32",
                                      "max_runs": "i32", "first_seq": "i32", "runs": "i32",
                                      "timeout_ns": "i64"},
                                     {}, ("atom.global.gpu.release.add",
                                          "st.global.release.sys.b64")),
    # The wpk executor's beat kernels (gpu.wpk.beat_kernels).
    "beat_kernels:gate": ({"work": "*i32", "target": "i32"}, {},
                          ("ld.global.acquire.gpu.b32", "nanosleep.u32")),
    "beat_kernels:frames_done": ({"frame_ctr": "*i32"}, {}, ("atom.global.gpu.release.add",)),
    "beat_kernels:gather_frames": ({"desc": "*i64", "number": "*i64", "generation": "*i64",
                                    "pcm": "*fp32", "audio": "*fp32", "torn": "*i32"},
                                   {"MAX_ROWS": 300, "SAMPLES": 1280, "BLOCK": 2048},
                                   ("fence.acq_rel.sys", "ld.global.acquire.sys.b64",
                                    "ld.volatile.global")),
}


def _ptxas() -> str:
    import triton
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas")


def compile_probe(name: str) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import importlib
    signature, constexprs, needs = PROBES[name]
    module, _, attr = name.rpartition(":")
    where = f"gpu.wpk.{module}" if module else "bench.harness.wpk_probes"
    kernel = getattr(importlib.import_module(where), attr)
    if not isinstance(kernel, triton.runtime.JITFunction):
        raise RuntimeError("compile checks need TRITON_INTERPRET unset (got an interpreted kernel)")
    sig = dict(signature, **{k: "constexpr" for k in constexprs}, IS_INTERP="constexpr")
    src = ASTSource(fn=kernel, signature=sig, constexprs=dict(constexprs, IS_INTERP=False))
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.ptx"
        path.write_text(ptx)
        report = subprocess.run([_ptxas(), "-arch=sm_90a", "-v", str(path), "-o",
                                 str(Path(tmp) / "kernel.cubin")],
                                capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", report)
    spills = re.findall(r"(\d+) bytes spill (?:stores|loads)", report)
    return {"name": name, "registers": int(regs.group(1)) if regs else None,
            "spill_bytes": sum(int(s) for s in spills),
            "missing": [w for w in needs if w not in ptx]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit("unset TRITON_INTERPRET: compile checks use the real compiler")
    rows = [compile_probe(name) for name in PROBES]
    if args.json:
        print(json.dumps(rows))
        return
    for r in rows:
        print(f"{r['name']:30s} registers {r['registers']:4d}  spills {r['spill_bytes']} B  "
              f"missing {r['missing'] or 'none'}")
    bad = [r for r in rows if r["missing"] or r["spill_bytes"]
           or (r["registers"] or 0) > budget(r["name"])]
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
