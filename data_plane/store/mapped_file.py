"""MappedFile: one fixed-size file of a log, mapped into memory.

    file name: <start offset, 20 digits zero-padded>      e.g. 00000000001073741824
    +---------------------------- file_size bytes ----------------------------+
    | written records ...          | zero bytes (not yet written)             |
    +------------------------------+------------------------------------------+
    0                         wrote_position                          file_size
                    flushed_position <= committed_position == wrote_position

Positions follow RocketMQ's vocabulary: *wrote* is where the next append goes, *committed* is
what readers may see (here equal to wrote: the mapping is the page cache), *flushed* is what
``fdatasync`` has made durable. In a file written only by appends (a CommitLog file) every
byte at or past ``dirty_end()`` — the larger of the wrote position and ``dirty_upto`` — is zero:
appends write at the wrote position, and moving it back (``cut``) keeps the old end in
``dirty_upto`` until ``zero_range`` has wiped what lay between. A file opened from disk may hold
anything past what recovery finds sound, so its ``dirty_upto`` starts at its size (recovery's
wipe brings it down); a new file's at 0. A cut's wipe is therefore as long as what was cut, not
as the rest of the file.

Two ways in. Files that keep a descriptor (the CommitLog) are written with ``pwrite`` and only
read through the mapping: the kernel copies into its page cache without a page fault per new
page, and never reads ahead — zeroing megabytes — inside a fault taken by the writer (what
RocketMQ's transient store pool achieves by writing a buffer through a FileChannel). The others
(ConsumeQueues, IndexFiles: 20 bytes a message) are written through the mapping. Blocks are
reserved before bytes reach them — whole CommitLog files on the allocation thread, chunk by
chunk for sparse files — so a full disk is an ``OSError`` at reservation time, never a SIGBUS
in the middle of an append.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from collections.abc import Callable, Iterator

from data_plane.store.config import PAGE_SIZE_BYTES
from data_plane.store.positions import FilePositions, compiled_module

FILE_NAME_DIGITS = 20
RESERVE_CHUNK_BYTES = 64 * 1024  # sparse files reserve this much ahead of the writes
ZERO_FILL_CHUNK_BYTES = 16 * 1024 * 1024  # one pwrite (GIL released) per 16 MiB; bytes(n) maps no memory
ZERO_WIPE_CHUNK_BYTES = 1024 * 1024  # a wipe reads (and, when not zero, rewrites) this much at a time


def offset_to_file_name(offset: int) -> str:
    return f"{offset:0{FILE_NAME_DIGITS}d}"


_ZEROS = bytes(ZERO_FILL_CHUNK_BYTES)
# Slices of this view share _ZEROS (a bytes slice would copy: n fresh bytes of process memory
# per call, which the allocator then keeps).
_ZEROS_VIEW = memoryview(_ZEROS)


def write_zeros(fd: int, size: int) -> None:
    """Fill a new file with zeros through ``pwrite`` (which releases the GIL). This reserves
    every block (ENOSPC surfaces here, not as SIGBUS in an append) and leaves the pages in the
    page cache, so appends through the mapping take minor faults only: a first write fault on a
    merely fallocated block costs ~8 us on ext4 (unwritten-extent conversion), and it would be
    taken with the GIL held."""
    pos = 0
    while pos < size:
        n = min(ZERO_FILL_CHUNK_BYTES, size - pos)
        written = os.pwrite(fd, _ZEROS_VIEW[:n], pos)
        pos += written


# ``_speedups.release``: madvise with the GIL released (None: pure Python, ``mmap.madvise``).
_speedups = compiled_module()
_compiled_release: Callable[[memoryview, int, int], int] | None = _speedups.release if _speedups else None

POPULATE_CALL_BYTES = 128 * 1024  # one posix_fadvise(WILLNEED) covers at most the readahead window


def py_populate(fd: int, start: int, length: int, call_bytes: int = POPULATE_CALL_BYTES) -> int:
    """Bring ``[start, start+length)`` of a file into the page cache; 0 or the errno. Each
    ``posix_fadvise(WILLNEED)`` reads ahead at most the kernel's readahead window (128 KiB by
    default), so the range goes in calls of ``call_bytes``; a block that holds no data yet (a
    reserved or sparse one) becomes a zero page with no disk read. Twin of the compiled
    ``_speedups.populate``, which makes all the calls with the GIL released once."""
    pos, end = start, start + length
    while pos < end:
        n = min(call_bytes, end - pos)
        try:
            os.posix_fadvise(fd, pos, n, os.POSIX_FADV_WILLNEED)
        except OSError as e:
            return e.errno or errno.EIO
        pos += n
    return 0


Populate = Callable[[int, int, int, int], int]


def pwrite_fully(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (a short write is continued; OSError otherwise)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, "no byte written")
        view = view[n:]
        offset += n


def data_ranges(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The parts of ``[start, end)`` of a file that the file system holds as data
    (``lseek`` with SEEK_DATA / SEEK_HOLE): the rest — holes, and on ext4 and XFS blocks
    reserved with ``posix_fallocate`` and never written — reads as zeros. All of it where the
    file system cannot tell."""
    pos = start
    while pos < end:
        try:
            pos = os.lseek(fd, pos, os.SEEK_DATA)
            hole = os.lseek(fd, pos, os.SEEK_HOLE)
        except OSError as e:
            if e.errno == errno.ENXIO:
                return  # no data from pos on
            yield pos, end  # (SEEK_DATA not supported here)
            return
        if pos >= end:
            return
        hole = min(end, hole) if hole > pos else end
        yield pos, hole
        pos = hole


def is_data_file_name(name: str) -> bool:
    return len(name) == FILE_NAME_DIGITS and name.isdigit()


class MappedFile(FilePositions):
    """A file of ``file_size`` bytes, mapped read/write, with wrote/committed/flushed positions
    (held by ``FilePositions``, positions.py)."""

    __slots__ = (
        "_fd",
        "_flush_lock",
        "_mm",
        "_populate_lock",
        "_released_upto",
        "_reserve_lock",
        "_zero_fill",
        "destroyed",
        "dirty_upto",
        "file_name",
        "mv",
        "path",
        "populated_upto",
        "released_behind",
    )

    def __init__(
        self, path: str, file_size: int, *, reserve: bool = True, keep_fd: bool = False, zero_fill: bool = True
    ) -> None:
        """Open or create ``path``. ``reserve`` allocates every block now (CommitLog files);
        otherwise blocks are reserved chunk by chunk as writes reach them (``ensure_reserved``).
        ``keep_fd`` keeps a descriptor for flushing (CommitLog files); others open one per flush
        so that thousands of ConsumeQueue files do not pin thousands of descriptors.
        ``zero_fill`` chooses how blocks are reserved (see ``ensure_reserved``)."""
        self.path = path
        self.file_name = os.path.basename(path)
        self.file_from_offset = int(self.file_name)
        self.file_size = file_size
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size_now = os.fstat(fd).st_size
            if size_now not in (0, file_size):
                raise OSError(f"{path}: size {size_now} differs from the configured {file_size}")
            if reserve and size_now == 0:
                if zero_fill:
                    write_zeros(fd, file_size)
                else:
                    os.posix_fallocate(fd, 0, file_size)
            if reserve:
                self.reserved_upto = file_size
            else:
                if size_now == 0:
                    os.ftruncate(fd, file_size)
                self.reserved_upto = 0
            self._mm = mmap.mmap(fd, file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            if size_now == 0:
                # A file we failed to create must not be mistaken later for an empty log file.
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise
        if keep_fd:
            self._fd = fd
        else:
            os.close(fd)  # the mapping holds its own descriptor
            self._fd = -1
        self.mv = memoryview(self._mm)
        self.hold_map(self.mv)  # the append path writes through the held view (positions.py)
        self.wrote_position = 0
        self.committed_position = 0
        self.flushed_position = 0
        self.dirty_upto = 0 if size_now == 0 else file_size  # (a file from disk: anything past its end)
        self.destroyed = False
        self.populated_upto = 0  # bytes below are in the page cache (PopulateAheadService)
        self.released_behind = 0  # pages below were dropped from the page tables (ReserveAheadService)
        self._released_upto = 0
        self._flush_lock = threading.Lock()
        self._reserve_lock = threading.Lock()
        self._populate_lock = threading.Lock()  # the descriptor stays open while in use
        self._zero_fill = zero_fill

    # --- writing ---------------------------------------------------------------------------
    @property
    def remaining(self) -> int:
        return self.file_size - self.wrote_position

    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    def ensure_reserved(self, upto: int, chunk: int = RESERVE_CHUNK_BYTES) -> None:
        """Reserve disk blocks up to byte ``upto`` and at least ``chunk`` past the last
        reservation (raises OSError(ENOSPC) on a full disk). Small randomly or sparsely written
        files (ConsumeQueues, IndexFiles) are reserved by writing zeros: the first write fault
        into a small fallocated (unwritten) ext4 extent cost up to a millisecond here (ext4
        zeroes it out on disk, in the fault, with the GIL held). CommitLog files
        (``zero_fill=False``) use ``posix_fallocate``: sequential writes into one large extent
        split it cheaply, and no zeros are copied through the page cache."""
        if upto <= self.reserved_upto:
            return
        with self._reserve_lock:  # the allocation thread may be reserving ahead of us
            if upto <= self.reserved_upto or self.destroyed:
                return
            end = min(self.file_size, max(upto, self.reserved_upto + chunk))
            fd = os.open(self.path, os.O_RDWR)
            try:
                pos = self.reserved_upto
                if not self._zero_fill:
                    os.posix_fallocate(fd, pos, end - pos)
                while self._zero_fill and pos < end:
                    n = min(ZERO_FILL_CHUNK_BYTES, end - pos)
                    pos += os.pwrite(fd, _ZEROS_VIEW[:n], pos)
            finally:
                os.close(fd)
            self.reserved_upto = end

    def append_bytes(self, data: bytes | memoryview) -> bool:
        """Copy ``data`` at the wrote position; False when it does not fit."""
        n = len(data)
        pos = self.wrote_position
        if pos + n > self.file_size:
            return False
        if pos + n > self.reserved_upto:
            self.ensure_reserved(pos + n)
        self.write_at(pos, data)
        self.wrote_position = self.committed_position = pos + n
        return True

    def write_at(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at ``pos`` without moving the positions: ``pwrite`` when the file
        keeps a descriptor, else through the mapping."""
        if self._fd >= 0:
            pwrite_fully(self._fd, data, pos)
        else:
            self.mv[pos : pos + len(data)] = data

    @property
    def fd(self) -> int:
        """The kept descriptor (-1 when the file does not keep one, or is closed)."""
        return self._fd

    def set_positions(self, position: int) -> None:
        """Recovery: everything before ``position`` is valid, nothing after it."""
        self.wrote_position = self.committed_position = self.flushed_position = position
        self.reserved_upto = max(self.reserved_upto, min(position, self.file_size))

    def dirty_end(self) -> int:
        """Where the bytes that may be non-zero end: every byte from here on is zero."""
        return max(self.dirty_upto, self.wrote_position)

    def cut(self, position: int) -> int:
        """Move every position back to ``position`` (readers no longer see what follows) and
        return the end of the bytes after it that may be non-zero: ``zero_range(position, end)``
        wipes them, before anything is appended again."""
        end = self.dirty_end()
        self.dirty_upto = end
        self.set_positions(position)
        self.reserved_upto = position  # what follows is reserved again before use
        return end

    def zero_from(self, position: int) -> None:
        """Wipe every byte from ``position`` to the end of the file (recovery's torn tail: what a
        crash left there is not known)."""
        self.zero_range(position, self.file_size)

    def zero_range(self, start: int, end: int) -> None:
        """Wipe ``[start, end)`` so its bytes can never be re-read, and make that durable; then
        nothing from ``start`` on is dirty any more (``dirty_upto``) unless the wrote position
        says so. Through pread/pwrite, not the mapping: reading a hole through a mapping may
        have to allocate a page (tmpfs), which on a full disk is SIGBUS. Only what the file
        system holds as data is read (``data_ranges``: blocks reserved and never written read
        as zeros) and only non-zero chunks are rewritten. Both calls release the GIL: a worker
        thread can do this while the event loop runs."""
        end = min(end, self.file_size)
        if start < end:
            fd = os.open(self.path, os.O_RDWR)
            try:
                for lo, hi in data_ranges(fd, start, end):
                    p = lo
                    while p < hi:
                        data = os.pread(fd, min(ZERO_WIPE_CHUNK_BYTES, hi - p), p)
                        if not data:
                            break
                        if data.count(0) != len(data):
                            pwrite_fully(fd, _ZEROS_VIEW[: len(data)], p)
                        p += len(data)
                os.fdatasync(fd)
            finally:
                os.close(fd)
        if end >= self.dirty_upto:
            self.dirty_upto = min(self.dirty_upto, start)

    # --- durability ------------------------------------------------------------------------
    def flush(self, least_pages: int = 0) -> int:
        """msync the bytes between the flushed and the wrote position; returns the flushed
        position. With ``least_pages`` > 0, does nothing until that many pages are dirty (a full
        file is always flushed). Safe to call from a thread other than the writer's."""
        with self._flush_lock:
            if self.destroyed:
                return self.flushed_position
            wrote = self.committed_position
            flushed = self.flushed_position
            if wrote <= flushed:
                return flushed
            dirty_pages = (wrote // PAGE_SIZE_BYTES) - (flushed // PAGE_SIZE_BYTES)
            if least_pages > 0 and wrote < self.file_size and dirty_pages < least_pages:
                return flushed
            # fdatasync, not msync: Python's mmap.flush holds the GIL for the whole msync and
            # would stall the event loop; fdatasync releases it and writes the same dirty pages.
            fd = self._fd
            try:
                if fd < 0:
                    fd = os.open(self.path, os.O_RDWR)
                    try:
                        os.fdatasync(fd)
                    finally:
                        os.close(fd)
                else:
                    os.fdatasync(fd)
            except FileNotFoundError:
                return flushed  # deleted by retention while we were about to flush it
            self.flushed_position = wrote
            return wrote

    def sync(self) -> None:
        """``fdatasync`` the file whatever its positions say: for bytes written where ``flush``
        does not look (a cut's zeros, past the wrote position). Safe from any thread."""
        with self._flush_lock:
            if self.destroyed:
                return
            fd = self._fd if self._fd >= 0 else os.open(self.path, os.O_RDWR)
            try:
                os.fdatasync(fd)
            finally:
                if fd != self._fd:
                    os.close(fd)

    def release_pages(self, keep_bytes: int) -> None:
        """Drop flushed pages more than ``keep_bytes`` behind the flush point from this
        process's page tables. The page cache keeps them; later reads fault them back in."""
        upto = ((self.flushed_position - keep_bytes) // PAGE_SIZE_BYTES) * PAGE_SIZE_BYTES
        if self.flushed_position >= self.file_size:
            upto = self.file_size
        with self._flush_lock:
            start = self._released_upto
            if self.destroyed:
                return
            if upto - start >= PAGE_SIZE_BYTES * 256 or (upto == self.file_size and upto > start):
                self._drop_pages(start, upto - start)
                self._released_upto = upto

    def release_range(self, start: int, end: int) -> None:
        """Drop the pages wholly inside [start, end) from this process's page tables."""
        start = -(-start // PAGE_SIZE_BYTES) * PAGE_SIZE_BYTES
        end = min(end, self.file_size) // PAGE_SIZE_BYTES * PAGE_SIZE_BYTES
        if end > start:
            with self._flush_lock:
                if not self.destroyed:
                    self._drop_pages(start, end - start)

    def release_all_pages(self) -> None:
        """Drop every resident page of this mapping from the process (reads fault back in)."""
        with self._flush_lock:
            if not self.destroyed:
                self._drop_pages(0, self.file_size)

    def _drop_pages(self, start: int, length: int) -> None:
        """``madvise(MADV_DONTNEED)`` on a page-aligned range of the mapping, with the GIL
        released when the compiled module is in use. Unmapping a range that reads faulted in
        takes the kernel tens of milliseconds a GiB (8-36 ms a file measured after
        ``orbit bench e2e``'s consume phase); Python's ``mmap.madvise`` holds the GIL throughout,
        and the event loop waited that long for it (docs/broker.md, "The flush thread's
        release of read pages")."""
        if _compiled_release is None:
            self._mm.madvise(mmap.MADV_DONTNEED, start, length)
            return
        err = _compiled_release(self.mv, start, length)
        if err:
            raise OSError(err, os.strerror(err), self.path)

    def populate(self, start: int, end: int, fill: Populate = py_populate) -> int:
        """Bring ``[start, end)`` into the page cache ahead of the writer, so its ``pwrite``s
        copy into pages that are there instead of allocating them; 0 or the errno. Only files
        with a descriptor (the CommitLog); ``fill`` is ``py_populate`` or its compiled twin."""
        end = min(end, self.file_size)
        with self._populate_lock:
            if self._fd < 0 or self.destroyed or end <= start:
                return 0
            return fill(self._fd, start, end - start, POPULATE_CALL_BYTES)

    def warm_up(self) -> None:
        """Touch every page so the first appends do not page-fault (optional, seed 7.x)."""
        mv = self.mv
        for pos in range(0, self.file_size, PAGE_SIZE_BYTES):
            mv[pos] = 0
        self._mm.madvise(mmap.MADV_WILLNEED, 0, self.file_size)

    # --- lifecycle -------------------------------------------------------------------------
    def last_modified(self) -> float:
        try:
            return os.stat(self.path).st_mtime
        except FileNotFoundError:
            return 0.0

    def close(self) -> bool:
        """Unmap; False while a reader still holds a slice (retry later)."""
        with self._flush_lock, self._populate_lock:
            self.destroyed = True
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        self.drop_map()
        try:
            self.mv.release()
            self._mm.close()
        except BufferError:
            return False
        return True

    def destroy(self) -> bool:
        """Delete the file and unmap it; False while a reader still holds a slice."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        return self.close()

    def __repr__(self) -> str:
        return (
            f"MappedFile({self.file_name}, wrote={self.wrote_position}, "
            f"flushed={self.flushed_position}, size={self.file_size})"
        )
