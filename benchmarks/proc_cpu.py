"""CPU time of a process or thread from ``/proc`` (Linux): user + sys seconds."""

from __future__ import annotations

import os
from pathlib import Path


def stat_cpu_s(stat: str) -> float:
    """User + sys CPU seconds in the text of a ``/proc/<pid>[/task/<tid>]/stat`` file
    (its name, in parentheses, may hold spaces: fields are counted after it) (pure)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + sys CPU seconds process ``pid`` has taken so far (every thread)."""
    return stat_cpu_s(Path(f"/proc/{pid}/stat").read_text())
