"""A periodic wake-up finer than the event loop's own timers, for open-loop generators.

asyncio's and uvloop's timers wait in whole milliseconds (``epoll_wait``'s timeout), so a
generator that must send every 30 µs either sends in millisecond bursts or spins the loop with
zero-length sleeps, and a spinning generator holds a core the server under test then lacks.
A Linux timerfd is a clock the loop watches like a socket: it becomes readable every
``interval_s`` (microseconds apart if asked), and the loop sleeps in ``epoll_wait`` in between,
woken by either the tick or the network.

``Ticker.create`` returns None where timerfd is not available (not Linux, no libc symbol); the
caller then paces another way.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
from collections.abc import Callable

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create  # noqa: B018  # (the attribute look-up is the availability check)
        libc.timerfd_settime  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def _timespec(seconds: float) -> _Timespec:
    ns = max(1, round(seconds * 1e9))
    return _Timespec(ns // 1_000_000_000, ns % 1_000_000_000)


class Ticker:
    """Calls ``on_tick()`` from the loop every ``interval_s`` until ``close()``. Ticks missed
    while the loop was busy are not made up: the next call comes at once, then the beat goes on
    (the caller's schedule, not the tick count, says what is due)."""

    __slots__ = ("_fd", "_loop", "_on_tick", "ticks")

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, on_tick: Callable[[], None]) -> None:
        self._loop = loop
        self._fd = fd
        self._on_tick = on_tick
        self.ticks = 0
        loop.add_reader(fd, self._ready)

    @classmethod
    def create(cls, loop: asyncio.AbstractEventLoop, interval_s: float, on_tick: Callable[[], None]) -> Ticker | None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        libc = _libc()
        if libc is None:
            return None
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            return None
        beat = _timespec(interval_s)
        spec = _Itimerspec(beat, beat)
        if libc.timerfd_settime(fd, 0, ctypes.byref(spec), None) != 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")
        return cls(loop, fd, on_tick)

    def _ready(self) -> None:
        try:
            os.read(self._fd, 8)  # the expirations since the last read (8 bytes); reading re-arms
        except BlockingIOError:
            return
        self.ticks += 1
        self._on_tick()

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
