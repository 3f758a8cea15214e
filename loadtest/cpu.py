"""CPU time spent per message: the benchmark's figure that the machine's speed drifts least.

On a shared VM a phase's rate moves ±20-30 % between runs of the same code; the CPU each
process spends on a message moves much less, so the benchmarks report it next to the rates.
A process's own CPU time comes from ``time.process_time``; another process's (the broker's)
from ``/proc/<pid>/stat`` (user + system clock ticks), so it is None off Linux.
"""

from __future__ import annotations

import os
import time

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds process ``pid`` has used, or None when /proc cannot say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # Fields after the command name (which may hold spaces) start at the state, field 3;
    # utime and stime are fields 14 and 15.
    fields = stat.rpartition(b")")[2].split()
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
    except (IndexError, ValueError):
        return None


class CpuWindow:
    """CPU time of this process and of another (``pid``, optional) between ``start`` and
    ``stop``."""

    __slots__ = ("_other", "_own", "other_s", "own_s", "pid")

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid
        self._own: float | None = None
        self._other: float | None = None
        self.own_s: float | None = None
        self.other_s: float | None = None

    def start(self) -> None:
        self._own = time.process_time()
        self._other = process_cpu_s(self.pid) if self.pid else None

    def stop(self) -> None:
        if self._own is None:
            return
        self.own_s = time.process_time() - self._own
        other = process_cpu_s(self.pid) if self.pid else None
        self.other_s = other - self._other if other is not None and self._other is not None else None


def us_per_msg(cpu_s: float | None, msgs: int) -> float | None:
    """Microseconds of CPU a message, one decimal; None without a figure or a message."""
    if cpu_s is None or msgs <= 0:
        return None
    return round(cpu_s / msgs * 1e6, 1)
