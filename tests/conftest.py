import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYTHONHASHSEED", "0")


def _cuda_visible() -> bool:
    # Decided before torch/triton import: Triton reads TRITON_INTERPRET at import time.
    return Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()


if not _cuda_visible():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # Triton kernels run on the CPU interpreter


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; runs on the device machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny models on a shared 2-core machine: one torch thread is far faster than two that
    contend (and than the pytest, node and helper threads fighting them)."""
    try:
        import torch
    except ImportError:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def process_wide_tf32_restored():
    """A GPU executor sets the process-wide TF32 flags for its profile: each test gets back the
    flags it started with, so an fp32 comparison is never judged under an earlier test's TF32
    (one failed so on the GPU: 2.2e-4 against a 1e-5 bound). The CPU has no TF32."""
    import torch
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
