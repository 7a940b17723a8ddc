"""Kernels compiled for the H100/H200 (sm_90) here, with no GPU: Triton's CPU interpreter runs
the kernels' arithmetic in the other tests but not the compiler, which sees an argument equal
to 1 as a constant (a plain int, with no tensor methods) and types every literal. A kernel
that passes in the interpreter and fails to compile on the device is caught here instead.

The Mamba step's stochastic rounding read `layer.to(tl.uint32)`: fine in the interpreter, a
CompilationError on the H100 for layer 1 (the second Mamba layer)."""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAMBA_POINTERS = {"XACT": "*fp32", "Z": "*bf16", "DT": "*bf16", "SSM": "*bf16", "SLOTS": "*i64",
                  "DT_BIAS": "*fp32", "A_LOG": "*fp32", "DSKIP": "*fp32", "YG": "*fp32",
                  "LENGTH": "*i64"}
# (name, layer: 1 comes as a constant as Triton specializes it, None an i32 argument, stochastic)
CASES = [(f"mamba-step-layer-{'1' if layer else 'arg'}-{'sr' if sr else 'plain'}", layer, sr)
         for layer in (1, None) for sr in (True, False)]


def compile_for_sm90(kernel, pointers: dict[str, str], constants: dict) -> dict:
    """`kernel` compiled to a cubin for sm_90: pointer arguments typed as given, `constants`
    specialized (the launch's constexprs, and an int argument equal to 1 as Triton specializes
    it), every other argument an i32. Needs the compiler, not the interpreter."""
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    names = list(inspect.signature(kernel.fn).parameters)
    signature = {n: pointers.get(n, "i32") for n in names}
    signature.update({n: "constexpr" for n in constants})
    src = ASTSource(kernel, signature, {(names.index(n),): v for n, v in constants.items()})
    return triton_compile(src, target=GPUTarget("cuda", 90, 32)).asm


def compile_cases() -> dict[str, str]:
    """Each case's outcome: "ok", or the compiler's error."""
    from gpu.kernels import mamba_step
    out = {}
    for name, layer, stochastic in CASES:
        constants = {"nheads": 128, "head_dim": 64, "d_state": 128, "heads_per_group": 16,
                     "BLOCK_P": 16, "BLOCK_N": 128, "STREAM": False, "TILES": 1,
                     "STOCHASTIC": stochastic}
        if layer is not None:
            constants["layer"] = layer
        pointers = {**MAMBA_POINTERS, "SSM": "*bf16" if stochastic else "*fp32"}
        try:
            asm = compile_for_sm90(mamba_step._ssm_kernel, pointers, constants)
            out[name] = "ok" if asm.get("cubin") else "no cubin"
        except Exception as exc:            # the compiler's message is the finding
            out[name] = f"{type(exc).__name__}: {exc}"[:2000]
    return out


@pytest.mark.slow       # a GPU compile in a subprocess: make test runs it, the edit loop does not
def test_the_mamba_step_compiles_for_sm90():
    """In a process of its own: the suite's conftest turns Triton's interpreter on, and an
    interpreted kernel cannot be compiled."""
    pytest.importorskip("triton.backends.nvidia")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, __file__], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(got) == {name for name, _, _ in CASES}
    bad = {name: why for name, why in got.items() if why != "ok"}
    assert not bad, bad


if __name__ == "__main__":
    print(json.dumps(compile_cases()))
