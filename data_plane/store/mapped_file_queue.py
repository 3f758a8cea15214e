"""MappedFileQueue: a directory of equal-size MappedFiles forming one logical byte stream.

    dir/00000000000000000000  dir/00000000001073741824  dir/00000000002147483648 ...
        [0, size)                 [size, 2*size)            [2*size, 3*size)

Logical offset ``o`` lives in file ``(o - first.file_from_offset) // file_size`` at position
``o % file_size``. The queue tracks ``flushed_where`` (everything before it is durable);
its max offset is the last file's start plus its wrote position.

A writer that gathers records before writing them (the compiled appender's staged appends,
single and batched, ``StoreConfig.write_stage_bytes``) sets ``sync_staged``: every lookup,
rollover and flush calls it first, so nothing past a file's wrote position is ever named by an
index while a reader or flusher looks.

The next file of a CommitLog is created ahead of need by ``AllocateMappedFileService`` on a
worker thread (fallocate, map, optional warm-up), so a rollover on the write path only swaps in
a ready file. A new ConsumeQueue's directory and first file may be made ahead too, by the
store's ``QueuePreparer`` when a topic is created (``ConsumeQueueTable.prepare``): the first
write then maps a file that exists.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from data_plane.store.mapped_file import MappedFile, is_data_file_name, offset_to_file_name

log = logging.getLogger(__name__)


def new_commit_log_file(path: str, file_size: int) -> MappedFile:
    """A CommitLog file with every block reserved (``posix_fallocate``): a full disk is an
    OSError here, never a SIGBUS in an append."""
    return MappedFile(path, file_size, reserve=True, keep_fd=True, zero_fill=False)


class AllocateMappedFileService:
    """Creates the next CommitLog file on a worker thread before the current one fills up."""

    def __init__(self, *, warm_up: bool) -> None:
        self._warm_up = warm_up
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="orbit-allocate")
        self._pending: dict[str, concurrent.futures.Future[MappedFile]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def _create(self, path: str, file_size: int) -> MappedFile:
        mf = new_commit_log_file(path, file_size)
        try:
            if self._warm_up and not self._stopping.is_set():
                mf.warm_up()
        except OSError:
            mf.destroy()  # a file we could not fill is not part of the log
            raise
        return mf

    def reopen(self) -> None:
        """Make a shut-down service usable again (a store started after a shutdown)."""
        with self._lock:
            if self._stopping.is_set():
                self._stopping.clear()
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="orbit-allocate")

    def request(self, path: str, file_size: int) -> None:
        """Start creating ``path`` in the background (no-op if already under way)."""
        with self._lock:
            if path not in self._pending:
                self._pending[path] = self._pool.submit(self._create, path, file_size)

    def take(self, path: str, file_size: int, next_path: str | None) -> MappedFile:
        """The file at ``path``: the pre-created one (waiting for it if it is under way), else
        one made now with its blocks reserved lazily as appends reach them. Also starts
        creating ``next_path``. Raises OSError when the file cannot be created."""
        with self._lock:
            fut = self._pending.pop(path, None)
        try:
            mf = None
            if fut is not None:
                try:
                    mf = fut.result()
                except OSError as e:
                    # Creating it ahead failed (a full disk, maybe since freed): try again now.
                    log.warning("pre-creating %s had failed (%s); creating it now", path, e)
            if mf is None:
                mf = new_commit_log_file(path, file_size)
        finally:
            if next_path is not None:
                self.request(next_path, file_size)
        return mf

    def shutdown(self) -> None:
        self._stopping.set()
        with self._lock:
            pending = list(self._pending.items())
            self._pending.clear()
        for path, fut in pending:
            try:
                mf = fut.result()
            except OSError:
                continue
            # A pre-created file that never took a byte is not part of the log.
            if mf.close():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        self._pool.shutdown(wait=True)


@dataclass(slots=True)
class TailCut:
    """What ``MappedFileQueue.cut`` leaves for the disk: ``wipe`` — the file that holds the cut
    and the range after it that may hold bytes (the cut's own length, not the rest of the file:
    ``MappedFile.dirty_end``) — and the files wholly after it, already out of the queue (no
    reader finds them), to delete."""

    wipe: tuple[MappedFile, int, int] | None
    removed: list[MappedFile]

    def finish(self) -> list[MappedFile]:
        """Wipe the range and delete the files: blocking I/O that releases the GIL, for a worker
        thread while the event loop goes on. Returns the deleted files a reader still maps (to
        close later, ``MappedFileQueue.retry_zombies``)."""
        if self.wipe is not None:
            mf, start, end = self.wipe
            mf.zero_range(start, end)
        return [mf for mf in self.removed if not mf.destroy()]


class MappedFileQueue:
    __slots__ = (
        "_allocator",
        "_keep_fd",
        "_zombies",
        "directory",
        "file_size",
        "files",
        "flushed_where",
        "sync_staged",
    )

    def __init__(
        self,
        directory: str,
        file_size: int,
        *,
        allocator: AllocateMappedFileService | None = None,
        keep_fd: bool = True,
    ) -> None:
        """``keep_fd``: each file keeps a descriptor, written with ``pwrite`` and flushed
        through it (few, busy files: the CommitLog); otherwise files are written through the
        mapping and one descriptor is opened per flush (thousands of ConsumeQueue files)."""
        self.directory = directory
        self.file_size = file_size
        self.files: list[MappedFile] = []
        self.flushed_where = 0
        self._allocator = allocator
        self._keep_fd = keep_fd
        self.sync_staged: Callable[[], object] | None = None
        self._zombies: list[MappedFile] = []  # destroyed but still referenced by a reader
        os.makedirs(directory, exist_ok=True)

    # --- loading ---------------------------------------------------------------------------
    def load(self) -> None:
        """Map every data file of the directory; positions are set by recovery afterwards."""
        names = sorted(n for n in os.listdir(self.directory) if is_data_file_name(n))
        for name in names:
            path = os.path.join(self.directory, name)
            size = os.path.getsize(path)
            if size != self.file_size:
                if size == 0:
                    log.warning("removing empty file %s (its creation was cut short)", path)
                    os.unlink(path)
                    continue
                if name != names[-1] or size > self.file_size:
                    raise OSError(f"{path}: size {size} differs from the configured {self.file_size}")
                # The last file lost its tail (a truncated copy, a filesystem that lost the
                # end): give it back its size; recovery keeps what is sound in it.
                log.warning("last file %s is %d bytes, not %d: extending it", path, size, self.file_size)
                with open(path, "r+b") as f:
                    f.truncate(self.file_size)
            mf = MappedFile(path, self.file_size, reserve=False, keep_fd=self._keep_fd, zero_fill=not self._keep_fd)
            mf.set_positions(self.file_size)
            self.files.append(mf)

    # --- lookup ----------------------------------------------------------------------------
    @property
    def first(self) -> MappedFile | None:
        return self.files[0] if self.files else None

    @property
    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def min_offset(self) -> int:
        return self.files[0].file_from_offset if self.files else 0

    def max_offset(self) -> int:
        if self.sync_staged is not None:
            self.sync_staged()
        if not self.files:
            return 0
        last = self.files[-1]
        return last.file_from_offset + last.wrote_position

    def find_by_offset(self, offset: int) -> MappedFile | None:
        if self.sync_staged is not None:
            self.sync_staged()
        files = self.files
        if not files:
            return None
        idx = (offset - files[0].file_from_offset) // self.file_size
        if 0 <= idx < len(files):
            mf = files[idx]
            if mf.file_from_offset <= offset < mf.file_from_offset + self.file_size:
                return mf
        for mf in files:  # holes after a deletion: fall back to a scan
            if mf.file_from_offset <= offset < mf.file_from_offset + self.file_size:
                return mf
        return None

    def last_file_for_write(self, start_offset: int = 0) -> MappedFile:
        """The file appends go to, rolling over to a new one when the last is full. Raises
        OSError when a new file cannot be created (full disk)."""
        if self.sync_staged is not None:
            self.sync_staged()
        last = self.files[-1] if self.files else None
        if last is not None and not last.is_full():
            return last
        if last is None:
            create_offset = start_offset - (start_offset % self.file_size)
        else:
            create_offset = last.file_from_offset + self.file_size
        path = os.path.join(self.directory, offset_to_file_name(create_offset))
        if self._allocator is not None:
            next_path = os.path.join(self.directory, offset_to_file_name(create_offset + self.file_size))
            mf = self._allocator.take(path, self.file_size, next_path)
        else:
            mf = (
                new_commit_log_file(path, self.file_size)
                if self._keep_fd
                else MappedFile(path, self.file_size, reserve=False, keep_fd=False)
            )
        if last is None and create_offset < start_offset:
            # A queue that starts mid-file (a ConsumeQueue whose history was deleted, a slave
            # that starts late): positions before the start are a hole, never read.
            mf.set_positions(start_offset - create_offset)
            self.flushed_where = start_offset
        elif last is None:
            self.flushed_where = create_offset
        self.files.append(mf)
        return mf

    # --- durability ------------------------------------------------------------------------
    def flush(self, least_pages: int = 0) -> bool:
        """Flush the file holding ``flushed_where``. True when nothing was left to flush."""
        mf = self.find_by_offset(self.flushed_where)  # (writes what is staged first)
        if mf is None:
            return True
        where = mf.file_from_offset + mf.flush(least_pages)
        done = where == self.flushed_where
        self.flushed_where = where
        if mf.flushed_position >= self.file_size:
            # Rolled over: keep flushing into the next file on the next call.
            return False
        return done

    def flush_all(self) -> None:
        """Flush until everything written so far is durable."""
        for _ in range(len(self.files) + 1):
            before = self.flushed_where
            self.flush(0)
            if self.flushed_where == before:
                break

    def release_flushed_pages(self, keep_bytes: int) -> None:
        for mf in self.files:
            if mf.flushed_position > 0:
                mf.release_pages(keep_bytes if mf is self.files[-1] else 0)

    # --- truncation and deletion -----------------------------------------------------------
    def truncate_dirty_files(self, offset: int) -> None:
        """Keep bytes before ``offset``; wipe the rest of its file; delete later files (``cut``,
        with its disk work done here)."""
        self.add_zombies(self.cut(offset).finish())

    def cut(self, offset: int) -> TailCut:
        """End the queue at ``offset``: the file holding it keeps the bytes before it (its
        positions move back), later files leave the queue. Memory only; the returned
        ``TailCut`` wipes and deletes on disk — on any thread, before anything is appended
        again."""
        keep: list[MappedFile] = []
        removed: list[MappedFile] = []
        wipe: tuple[MappedFile, int, int] | None = None
        for mf in self.files:
            end = mf.file_from_offset + self.file_size
            if end <= offset:
                keep.append(mf)
            elif mf.file_from_offset <= offset:
                pos = offset - mf.file_from_offset
                wipe = (mf, pos, mf.cut(pos))
                keep.append(mf)
            else:
                removed.append(mf)
        self.files = keep
        self.flushed_where = min(self.flushed_where, offset)
        return TailCut(wipe, removed)

    def delete_first_files(self, count: int) -> list[MappedFile]:
        """Delete the ``count`` oldest files (never the last one)."""
        count = min(count, len(self.files) - 1)
        gone = self.files[:count] if count > 0 else []
        for mf in gone:
            self._destroy(mf)
        self.files = self.files[len(gone) :]
        return gone

    def delete_expired_by_time(
        self, *, expired_before: float, force: bool, max_batch: int, now: Callable[[], float] = time.time
    ) -> list[MappedFile]:
        """Delete oldest files whose last modification is before ``expired_before`` (epoch
        seconds), or — with ``force`` — the oldest files regardless of age."""
        count = 0
        for mf in self.files[:-1]:
            if count >= max_batch:
                break
            if force or mf.last_modified() < expired_before:
                count += 1
            else:
                break
        return self.delete_first_files(count)

    def _destroy(self, mf: MappedFile) -> None:
        if not mf.destroy():
            self._zombies.append(mf)

    def add_zombies(self, files: list[MappedFile]) -> None:
        """Deleted files a reader still maps: ``retry_zombies`` closes them later."""
        self._zombies += files

    def retry_zombies(self) -> None:
        self._zombies = [mf for mf in self._zombies if not mf.close()]

    def close(self) -> None:
        for mf in self.files:
            if not mf.close():
                self._zombies.append(mf)
        self.files = []

    def destroy(self) -> None:
        for mf in self.files:
            self._destroy(mf)
        self.files = []
