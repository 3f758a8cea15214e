"""The processes that do an offload's heavy work: the upload of a CommitLog file and the build of
its index object, each in a worker process of its own, in the background.

In the broker's process that work would share the interpreter lock with the event loop (the
upload's reads, MD5s and socket writes, the index build's walk over every record). In processes
of their own it shares only the cores, and there it comes last: with ``idle`` (the default) the
workers run under SCHED_IDLE, so they take only CPU nothing else wants and any broker thread
that wakes takes the core from them at once — a niced process can keep a core for a scheduler
slice of several milliseconds. Without ``idle`` they run at nice ``BACKGROUND_NICE``. A worker
killed (a broken pool) is replaced by a new pool at the next use; a worker dies with the thread
that started it (the broker's offload thread, or the whole broker killed with -9).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from data_plane.store.tier import file_index
from data_plane.store.tier.object_store import Endpoint, ObjectStore, Uploaded

T = TypeVar("T")
PR_SET_PDEATHSIG = 1  # prctl(2)
BACKGROUND_NICE = 10
WORKERS = 2  # an upload and an index build at once

_stores: dict[Endpoint, ObjectStore] = {}  # per worker process: one client (and its connections) a bucket


def _die_with(parent: int) -> None:
    """This process is killed when the thread that started it ends — the broker's offload thread,
    or the broker itself killed with -9: an orphaned upload must not finish on its own after the
    broker that would have recorded it is gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def _background(parent: int, idle: bool) -> None:
    _die_with(parent)
    if idle:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    else:
        os.nice(BACKGROUND_NICE)


def _upload(endpoint: Endpoint, key: str, path: str, length: int, part_bytes: int, bytes_per_s: int) -> Uploaded:
    store = _stores.get(endpoint)
    if store is None:
        store = _stores[endpoint] = ObjectStore.at(endpoint)
    return store.upload_file(key, path, length, part_bytes, bytes_per_s)


def scheduling() -> tuple[int, int]:
    """(policy, nice) of the calling process: what a worker runs at (for tests and runtime info)."""
    return os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)


class OffloadWorkers:
    def __init__(self, *, idle: bool) -> None:
        self.idle = idle
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def _submit(self, fn: Callable[..., T], *args: object) -> concurrent.futures.Future[T]:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                WORKERS,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_background,
                initargs=(os.getpid(), self.idle),
            )
        try:
            return self._pool.submit(fn, *args)
        except BrokenProcessPool:  # (a worker was killed): a new pool next time
            self._pool = None
            raise

    def build_index(self, path: str, from_offset: int, length: int) -> concurrent.futures.Future[bytes]:
        return self._submit(file_index.build_data, path, from_offset, length)

    def upload(
        self, endpoint: Endpoint, key: str, path: str, length: int, part_bytes: int, bytes_per_s: int
    ) -> concurrent.futures.Future[Uploaded]:
        return self._submit(_upload, endpoint, key, path, length, part_bytes, bytes_per_s)

    def scheduling(self) -> tuple[int, int]:
        """A worker's (policy, nice)."""
        return self.result(self._submit(scheduling))

    def pids(self) -> list[int]:
        """The worker processes' ids (none before the first use)."""
        return sorted(self._pool._processes) if self._pool is not None else []

    def result(self, future: concurrent.futures.Future[T]) -> T:
        """The future's result; a broken pool (a worker killed) is dropped for a new one."""
        try:
            return future.result()
        except BrokenProcessPool:
            self._pool = None
            raise

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
