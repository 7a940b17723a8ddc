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
