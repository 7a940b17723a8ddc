"""CPU time of another process of the node (a session worker, the engine), for the bench.

Linux's /proc/<pid>/stat: user and system time in clock ticks. None where there is no /proc or
the process is gone: the bench then reports no figure rather than a wrong one."""
from __future__ import annotations

import os

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S
