"""What a benchmark measures of the machine it runs on, to put beside its figures: the disk's
sequential write bandwidth, how fast new page-cache pages come, and the interpreter's speed now
(a shared virtual machine's drifts between hours)."""

from __future__ import annotations

import os
import time


def _write_probe(directory: str, megabytes: int, *, fdatasync: bool, tail_from: int = 0) -> tuple[float, float]:
    """``megabytes`` 1 MiB writes of new bytes to a new file (then ``fdatasync`` if asked), after
    the earlier dirty pages are written back. Returns the seconds of the whole and of the writes
    from ``tail_from`` on."""
    path = os.path.join(directory, "write-probe")
    block = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.sync()
        t = t_tail = time.perf_counter()
        for i in range(megabytes):
            if i == tail_from:
                t_tail = time.perf_counter()
            os.write(fd, block)
        if fdatasync:
            os.fdatasync(fd)
        end = time.perf_counter()
    finally:
        os.close(fd)
        os.unlink(path)
    return end - t, end - t_tail


def disk_seq_write(directory: str, megabytes: int) -> dict[str, float]:
    dt, _ = _write_probe(directory, megabytes, fdatasync=True)
    return {"megabytes": megabytes, "seconds": round(dt, 3), "mb_per_s": round(megabytes / dt, 1)}


def page_cache_write(directory: str, megabytes: int) -> dict[str, float]:
    """1 MiB writes of new bytes, no flush: the rate at which this machine takes new page-cache
    pages. Memory the kernel freed moments ago is quick to reuse; memory a VM's balloon has
    handed back to the host costs a host fault per page. The probe writes four times
    ``megabytes`` and reports the whole and its last quarter, by which time the recently
    freed memory is used up."""
    total = 4 * megabytes
    dt, dt_last = _write_probe(directory, total, fdatasync=False, tail_from=3 * megabytes)
    return {
        "megabytes": total,
        "seconds": round(dt, 3),
        "mb_per_s": round(total / dt, 1),
        "last_quarter_mb_per_s": round(megabytes / dt_last, 1),
    }


def python_loop_ns(iterations: int = 2_000_000) -> float:
    """Nanoseconds a simple CPython loop iteration takes now: a shared virtual machine's speed can drift 2-3x
    between hours, and a figure means little without it (the store's figures follow it)."""
    best = float("inf")
    for _ in range(3):
        total = 0
        t = time.perf_counter()
        for i in range(iterations):
            total += i
        best = min(best, time.perf_counter() - t)
    return round(best / iterations * 1e9, 1)
