"""IdleQueues: ConsumeQueues nobody uses hold no mapping and no descriptor.

A (topic, queue id) whose ConsumeQueue has taken no unit and served no read of units for
``idle_s`` (the broker's ``idle_queue_close_s``) is closed to idle: its files are flushed and
unmapped, which closes the descriptor each mapping holds (``ConsumeQueue.detach_idle``). The
queue object stays, with its offsets in memory, so min and max offsets — and a pull at the end of
the queue, the answer a long-polling consumer of an idle topic gets — need no file. The first
append or read of units maps the same files again (``ConsumeQueue.reopen``).

A sweep (``sweep``, every ``interval_s`` on the event loop) runs in three steps:

1. on the loop, a look at every queue: one whose max offset moved or that was read
   (``ConsumeQueue.touched``) since the last look is in use now; one unused for ``idle_s`` is a
   candidate;
2. on a worker thread, the candidates are flushed (the fdatasync, or one sync(2) for many);
3. on the loop, under the CommitLog lock (no appender on any thread meanwhile), each candidate
   still unused, with nothing pending and nothing left unflushed, lets go of its files; a worker
   thread unmaps them (a file a reader still holds a slice of waits among the queue's zombies).

The loop never waits on the disk, and a queue in use is never closed: whatever appends or reads
runs on the loop between the steps, and step 3 looks again. Held pulls (long_poll.py) keep no
reference to a queue's files, so the sweep need not spare their queues.

Time is the store's clock (``MessageStore.clock_ms``), in seconds here. A queue first seen by a
sweep (after a restart: every queue recovery mapped) counts as in use since its last file was
last modified, so a broker restarted among idle topics closes them again at its first sweep.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

from data_plane.store.consume_queue import ConsumeQueue
from data_plane.store.index_flush import flush_queues
from data_plane.store.mapped_file import MappedFile

if TYPE_CHECKING:
    from data_plane.store.message_store import MessageStore

log = logging.getLogger(__name__)

DEFAULT_IDLE_S = 86_400.0
MIN_IDLE_S = 0.1
MAX_INTERVAL_S = 60.0
LOOK_BATCH = 256  # queues looked at (or let go of) between two turns of the event loop


def sweep_interval_s(idle_s: float) -> float:
    """How often to sweep: a quarter of the idle time, at most a minute."""
    return min(MAX_INTERVAL_S, idle_s / 4)


def idle_problem(idle_s: float) -> str | None:
    """Why ``idle_s`` is not a usable ``idle_queue_close_s`` (None: it is)."""
    if idle_s != 0 and not idle_s >= MIN_IDLE_S:
        return f"idle_queue_close_s must be 0 (never close idle queues) or at least {MIN_IDLE_S} s, not {idle_s}"
    return None


def _flush(queues: list[ConsumeQueue]) -> None:
    """Flush every unit of ``queues`` (worker thread)."""
    flush_queues(queues, 0)
    for cq in queues:
        if cq.dirty_pages():  # (a queue that rolled over since its last flush: more files)
            cq.mfq.flush_all()


def _close_files(detached: list[tuple[ConsumeQueue, list[MappedFile]]]) -> list[tuple[ConsumeQueue, MappedFile]]:
    """Unmap (worker thread); the files a reader still holds a slice of, to close later."""
    return [(cq, mf) for cq, files in detached for mf in files if not mf.close()]


class IdleQueues:
    def __init__(self, store: MessageStore, idle_s: float = DEFAULT_IDLE_S) -> None:
        problem = idle_problem(idle_s)
        if problem is not None:
            raise ValueError(problem)
        self.store = store
        self.idle_s = idle_s
        self.interval_s = sweep_interval_s(idle_s) if idle_s > 0 else 0.0
        self.closed_total = 0  # queues closed to idle since start (statistics)

    def _now_s(self) -> float:
        return self.store.clock_ms() / 1000

    # --- the steps -------------------------------------------------------------------------
    async def candidates(self) -> list[ConsumeQueue]:
        """Step 1 (the loop): queues open and unused for ``idle_s``."""
        now = self._now_s()
        out: list[ConsumeQueue] = []
        queues = list(self.store.queues)
        for n, cq in enumerate(queues, 1):
            if not cq.closed and self._unused(cq, now):
                out.append(cq)
            if n % LOOK_BATCH == 0:
                await asyncio.sleep(0)
        return out

    def _unused(self, cq: ConsumeQueue, now: float) -> bool:
        """Marks ``cq`` in use now when it was used since the last look; whether it has been
        unused for ``idle_s``."""
        top = cq.max_offset_in_queue()
        if cq.seen_max < 0:
            cq.active_at_s = min(now, self._last_modified(cq))
        elif top != cq.seen_max or cq.touched:
            cq.active_at_s = now
        cq.seen_max = top
        cq.touched = False
        return now - cq.active_at_s >= self.idle_s and cq.mapped_files() > 0

    @staticmethod
    def _last_modified(cq: ConsumeQueue) -> float:
        mf = cq.last_file
        try:
            return os.stat(mf.path).st_mtime if mf is not None else 0.0
        except OSError:
            return 0.0

    def detach(self, queues: list[ConsumeQueue]) -> list[tuple[ConsumeQueue, list[MappedFile]]]:
        """Step 3 (the loop): the queues still unused let go of their files (returned, to
        unmap). Nothing when an appender on another thread holds the CommitLog lock."""
        lock = self.store.commit_log.lock
        if not lock.acquire(False):
            return []
        out = []
        try:
            for cq in queues:
                if cq.touched or cq.max_offset_in_queue() != cq.seen_max:
                    continue  # used since step 1: the next sweep counts it
                files = cq.detach_idle()
                if files:
                    out.append((cq, files))
        finally:
            lock.release()
        self.closed_total += len(out)
        return out

    async def sweep(self) -> int:
        """One sweep (the three steps); how many queues it closed."""
        found = await self.candidates()
        if not found:
            return 0
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, _flush, found)
        detached: list[tuple[ConsumeQueue, list[MappedFile]]] = []
        for at in range(0, len(found), LOOK_BATCH):
            detached += self.detach(found[at : at + LOOK_BATCH])
            await asyncio.sleep(0)
        for cq, mf in await loop.run_in_executor(None, _close_files, detached):
            cq.mfq.add_zombies([mf])  # (closed by retention's retry_zombies)
        if detached:
            log.info("closed %d idle ConsumeQueues (unused for %.0f s)", len(detached), self.idle_s)
        return len(detached)

    async def run(self) -> None:
        """Sweep every ``interval_s`` until cancelled (not at all with ``idle_s`` 0)."""
        if self.idle_s <= 0:
            return
        while True:
            await asyncio.sleep(self.interval_s)
            if not self.store.running:
                continue
            try:
                await self.sweep()
            except Exception:
                log.exception("idle ConsumeQueue sweep failed")

    # --- statistics ------------------------------------------------------------------------
    def runtime_info(self) -> dict[str, int]:
        """``mappedQueueFiles``: ConsumeQueue files mapped now; ``idleClosedQueues``: queues
        closed to idle now; ``openFds``: the process's open descriptors (Linux's /proc)."""
        mapped = closed = 0
        for cq in self.store.queues:
            mapped += cq.mapped_files()
            closed += cq.closed
        return {"mappedQueueFiles": mapped, "idleClosedQueues": closed, "openFds": open_fds()}


def open_fds() -> int:
    """The process's open descriptors (-1 where /proc/self/fd is not there)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # (less the one listdir opened)
    except OSError:
        return -1
