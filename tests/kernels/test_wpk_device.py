"""The wpk probes on a GPU (`bench/wpk_sync_device.py`'s checks, small): a chain against launch
order and rounds of grid barriers, one program an SM and launched cooperatively, and a
doorbell answered from pinned host memory; the mailbox's controller with stand-in lanes. Catches what the interpreter cannot: a wait the
compiler hoisted out of its loop (a hang), a release that does not order the data before the
flag (wrong sums), a host store the device never sees."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_chain_rounds_and_doorbell_on_the_device():
    import bench.wpk_sync_device as dev
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert dev.chain(sms)["correct"]
    assert dev.rounds(sms, 20)["correct"]
    bell = dev.doorbell(20)
    assert bell["answered"] == 20 and bell["stamps_rise"]
    box = dev.mailbox(20)
    assert box["correct"] and box["error"] is None
