"""Where a file's pages are: in the page cache (mincore(2) over a read-only mapping of it), and
in this process's page tables (/proc/self/smaps)."""

from __future__ import annotations

import ctypes
import mmap
import os

from data_plane.store.config import PAGE_SIZE_BYTES

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value


def resident_pages(path: str, start: int, end: int) -> list[bool]:
    """For each page of ``[start, end)`` (page-aligned), whether the page cache holds it.
    Mapping a file reads nothing in; only touching it would."""
    assert start % PAGE_SIZE_BYTES == 0
    assert end % PAGE_SIZE_BYTES == 0
    assert end > start
    length = end - start
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
    finally:
        os.close(fd)
    if address in (None, _MAP_FAILED):
        raise OSError(ctypes.get_errno(), "mmap failed")
    try:
        vec = (ctypes.c_ubyte * (length // PAGE_SIZE_BYTES))()
        if _libc.mincore(address, length, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return [bool(b & 1) for b in vec]
    finally:
        _libc.munmap(address, length)


def mapped_resident_kib(path: str) -> int:
    """Rss of this process's mapping of ``path`` (from /proc/self/smaps)."""
    current = None
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(maxsplit=5)
            if len(first) >= 5 and "-" in first[0] and ":" in first[3]:
                current = first[5].strip() if len(first) == 6 else ""
            elif line.startswith("Rss:") and current == path:
                return int(line.split()[1])
    raise AssertionError(f"{path} is not mapped")
