"""`proc_cpu.cpu_seconds`: another process's CPU from /proc. Catches a parse that reads the wrong
fields (start time or a page count instead of user + system time: far off the interpreter's own
count) and a figure for a process that is gone."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from wave_actors.runtime.proc_cpu import cpu_seconds

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")


def test_a_busy_process_has_spent_cpu_and_a_gone_one_has_none():
    code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n" \
           "time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(100):
            spent = cpu_seconds(proc.pid)
            if spent is not None and spent >= 0.25:
                break
            time.sleep(0.05)
        assert 0.25 <= spent < 5.0
    finally:
        proc.kill()
        proc.wait()
    assert cpu_seconds(proc.pid) is None


def test_own_cpu_matches_the_interpreters_count():
    t = time.process_time()
    while time.process_time() - t < 0.2:
        pass
    assert abs(cpu_seconds(os.getpid()) - time.process_time()) < 0.1
