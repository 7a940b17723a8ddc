"""Helpers the model and kernel tests share: relative error in float64, and a no-autograd fixture."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
