"""Helpers the model and kernel tests share: relative error in float64, a no-autograd fixture, and
fp32 matmuls and convolutions where a test compares two fp32 paths."""
import contextlib

import pytest
import torch


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@contextlib.contextmanager
def exact_fp32():
    """Within: matmuls and cuDNN convolutions in fp32. On the GPU cuDNN defaults to TF32 and a
    GraphExecutor sets the matmul flag for its profile (~1e-3 either), which would hide an error
    between two fp32 paths; on the CPU this changes nothing."""
    with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=False):
        tf32, torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32, False
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32


def counting(ops, method: str):
    """`ops` whose `method` counts its calls in `ops.calls` (then runs as before): a hook that a
    test expects the model to take, or not to."""
    inner = getattr(ops, method)
    ops.calls = 0

    def counted(*args, **kwargs):
        ops.calls += 1
        return inner(*args, **kwargs)

    setattr(ops, method, counted)
    return ops


def edit_loop(cases: list, keep: int) -> list:
    """A kernel test's parameter sets with all but the first `keep` marked slow: each case is
    ~0.5-1 s under the Triton interpreter, so `make test-fast` (the edit loop) runs the first
    ones and `make test` runs every one. Order the cases so the first `keep` cover the kernel's
    main forms."""
    return [c if i < keep else pytest.param(*c, marks=pytest.mark.slow)
            for i, c in enumerate(cases)]
