"""UsageSpool: usage records kept on the broker's disk until the control plane has them.

    <dir>/usage.spool        append-only; one JSON line per record, fsync'd before append returns
                             {"seq":17,"record":{"report_id":"broker-a:1700000040000:acme",...}}\\n
    <dir>/usage.state.json   {"acked_seq":12,"last_minute":1700000040000}   (ConfigFile: atomic,
                             fsync'd, with a .bak)

``seq`` numbers records 1, 2, 3 … without gaps, across compactions and restarts. A record is
acknowledged once the control plane answered 2xx for a batch holding it: ``acked_seq`` moves past
it and the reporter never sends it again. Records at or below ``acked_seq`` still in the file
(a crash between the state write and the compaction) are skipped when read, so nothing is sent
twice by the broker; a record is sent again only when its 2xx was lost on the way, and the
control plane drops it by ``report_id`` (idempotent).

Compaction: when every record is acknowledged the file is truncated to nothing; when the
acknowledged prefix is large (``compact_min_bytes`` and half the file) the unacknowledged tail is
copied into ``usage.spool.tmp``, fsync'd and renamed over the spool (then the directory is
fsync'd). Either way the state file was written first, so a crash leaves either file, and both
read the same.

Bounded: ``append`` refuses a batch that would take the file past ``max_bytes`` (after trying to
compact) and answers ``SpoolStatus.FULL``, logging a warning — the caller keeps the usage (the
meter folds it into the next minute) and nothing already spooled is dropped.

Crash recovery on open: a torn last line (no newline) is cut off; a line that does not parse is
logged and skipped. Thread-safe: the reporter reads and acknowledges from worker threads
(``asyncio.to_thread``) while the meter appends from another.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import orjson

from data_plane.broker.persisted import ConfigFile

if TYPE_CHECKING:
    from data_plane.tenancy.metering import UsageRecord

log = logging.getLogger(__name__)

SPOOL_FILE = "usage.spool"
STATE_FILE = "usage.state.json"
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_COMPACT_MIN_BYTES = 1024 * 1024
_READ_CHUNK_BYTES = 256 * 1024


class SpoolStatus(enum.Enum):
    OK = "OK"
    FULL = "FULL"


@dataclass(frozen=True, slots=True)
class SpoolBatch:
    """Records read for one send; hand it back to ``ack`` once the control plane took it."""

    records: list[UsageRecord]
    first_seq: int
    last_seq: int
    end_offset: int  # in the spool file of ``generation``, just past the last record read
    generation: int


class UsageSpool:
    def __init__(
        self,
        directory: str,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        compact_min_bytes: int = DEFAULT_COMPACT_MIN_BYTES,
        fsync: bool = True,
    ) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.compact_min_bytes = compact_min_bytes
        self._fsync = fsync
        self._lock = threading.Lock()
        os.makedirs(directory, exist_ok=True)
        self._path = os.path.join(directory, SPOOL_FILE)
        self._state = ConfigFile(os.path.join(directory, STATE_FILE))
        self._acked_seq = 0
        self._last_minute = 0
        self._last_seq = 0  # the highest seq ever written
        self._read_offset = 0  # the first byte not known to be acknowledged
        self._size = 0
        self._generation = 0  # bumped by every compaction: offsets of older batches are stale
        self.corrupt_lines = 0
        self.full_refusals = 0
        self._open()

    # --- open and recover ---------------------------------------------------------------------
    def _open(self) -> None:
        doc = self._state.load() or {}
        self._acked_seq = int(doc.get("acked_seq", 0))
        self._last_minute = int(doc.get("last_minute", 0))
        self._last_seq = self._acked_seq
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._path + ".tmp")  # an unfinished compaction: the spool itself is intact
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            data = _read_all(fd)
            good = data.rfind(b"\n") + 1
            if good < len(data):
                log.warning("usage spool %s: cutting a torn last line (%d bytes)", self._path, len(data) - good)
                os.ftruncate(fd, good)
                if self._fsync:
                    os.fsync(fd)
            offset = 0
            read_offset_found = False
            for line in data[:good].split(b"\n")[:-1]:
                decoded = _decode(line)
                if decoded is None:
                    self.corrupt_lines += 1
                    log.error("usage spool %s: skipping a line that does not parse: %r", self._path, line[:200])
                else:
                    seq, record = decoded
                    self._last_seq = max(self._last_seq, seq)
                    self._last_minute = max(self._last_minute, int(record.get("minute", 0)))
                    if seq > self._acked_seq and not read_offset_found:
                        self._read_offset = offset
                        read_offset_found = True
                offset += len(line) + 1
            if not read_offset_found:
                self._read_offset = good
            self._size = good
        finally:
            os.close(fd)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        if self._read_offset == self._size and self._size > 0:
            self._truncate_all()

    # --- append (the meter, once a minute) ------------------------------------------------------
    def append(self, records: Sequence[UsageRecord]) -> SpoolStatus:
        """Write and fsync ``records``; FULL (nothing written) when they would pass ``max_bytes``.
        Raises OSError when the disk fails; the file is cut back to where it was."""
        if not records:
            return SpoolStatus.OK
        with self._lock:
            seq = self._last_seq
            lines = []
            last_minute = self._last_minute
            for r in records:
                seq += 1
                lines.append(orjson.dumps({"seq": seq, "record": r}))
                last_minute = max(last_minute, r["minute"])
            data = b"\n".join(lines) + b"\n"
            if self._size + len(data) > self.max_bytes and self._read_offset > 0:
                self._compact()
            if self._size + len(data) > self.max_bytes:
                self.full_refusals += 1
                log.warning(
                    "usage spool %s is full (%d of %d bytes, %d records not acknowledged by the control "
                    "plane): %d new records refused",
                    self._path,
                    self._size,
                    self.max_bytes,
                    self._last_seq - self._acked_seq,
                    len(records),
                )
                return SpoolStatus.FULL
            try:
                _write_all(self._fd, data)
                if self._fsync:
                    os.fsync(self._fd)
            except OSError:
                try:
                    os.ftruncate(self._fd, self._size)
                except OSError:
                    log.exception("usage spool %s: cannot cut a failed append back", self._path)
                raise
            self._size += len(data)
            self._last_seq = seq
            self._last_minute = last_minute
            return SpoolStatus.OK

    # --- read and acknowledge (the reporter) ----------------------------------------------------
    def read_batch(self, max_records: int) -> SpoolBatch | None:
        """Up to ``max_records`` unacknowledged records, oldest first; None when there are none."""
        with self._lock:
            if self._read_offset >= self._size:
                return None
            records: list[UsageRecord] = []
            first_seq = last_seq = 0
            pos = end = self._read_offset
            with open(self._path, "rb") as f:
                f.seek(pos)
                buf = b""
                while len(records) < max_records and pos < self._size:
                    chunk = f.read(min(_READ_CHUNK_BYTES, self._size - pos))
                    if not chunk:
                        break
                    pos += len(chunk)
                    lines = (buf + chunk).split(b"\n")
                    buf = lines.pop()  # an incomplete line: the next chunk completes it
                    for line in lines:
                        end += len(line) + 1
                        decoded = _decode(line)
                        if decoded is None or decoded[0] <= self._acked_seq:
                            continue
                        seq, record = decoded
                        first_seq = first_seq or seq
                        last_seq = seq
                        records.append(record)
                        if len(records) >= max_records:
                            break
            if not records:
                # Only acknowledged or unreadable lines were left: skip past them.
                self._read_offset = end
                return None
            return SpoolBatch(records, first_seq, last_seq, end, self._generation)

    def ack(self, batch: SpoolBatch) -> None:
        """The control plane has ``batch``: never send it again, and compact when it pays."""
        with self._lock:
            if batch.last_seq <= self._acked_seq:
                return
            self._acked_seq = batch.last_seq
            self._state.save({"acked_seq": self._acked_seq, "last_minute": self._last_minute})
            if batch.generation == self._generation:
                self._read_offset = max(self._read_offset, batch.end_offset)
            else:
                self._read_offset = self._find_first_unacked()
            if self._read_offset >= self._size:
                self._truncate_all()
            elif self._read_offset >= self.compact_min_bytes and self._read_offset * 2 >= self._size:
                self._compact()

    def _find_first_unacked(self) -> int:
        with open(self._path, "rb") as f:
            data = f.read(self._size)
        offset = 0
        for line in data.split(b"\n")[:-1]:
            decoded = _decode(line)
            if decoded is not None and decoded[0] > self._acked_seq:
                return offset
            offset += len(line) + 1
        return self._size

    # --- compaction -----------------------------------------------------------------------------
    def _truncate_all(self) -> None:
        """Every record is acknowledged (and the state file says so): empty the file."""
        os.ftruncate(self._fd, 0)
        if self._fsync:
            os.fsync(self._fd)
        self._size = 0
        self._read_offset = 0
        self._generation += 1

    def _compact(self) -> None:
        """Keep only the unacknowledged tail: write it aside, fsync, rename over, fsync the dir."""
        tmp = self._path + ".tmp"
        with open(self._path, "rb") as src:
            src.seek(self._read_offset)
            tail = src.read(self._size - self._read_offset)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _write_all(fd, tail)
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self._path)
        if self._fsync:
            dfd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        os.close(self._fd)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        log.info("usage spool %s compacted: %d bytes kept, %d dropped", self._path, len(tail), self._read_offset)
        self._size = len(tail)
        self._read_offset = 0
        self._generation += 1

    # --- introspection --------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Records written and not acknowledged."""
        with self._lock:
            return self._last_seq - self._acked_seq

    @property
    def acked_seq(self) -> int:
        return self._acked_seq

    @property
    def last_minute(self) -> int:
        """The latest ``minute`` ever spooled here (kept across compactions and restarts)."""
        return self._last_minute

    @property
    def size_bytes(self) -> int:
        return self._size

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _decode(line: bytes) -> tuple[int, UsageRecord] | None:
    """(seq, record) of one spool line; None when it does not parse."""
    try:
        doc = orjson.loads(line)
        return int(doc["seq"]), cast("UsageRecord", dict(doc["record"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def _read_all(fd: int) -> bytes:
    parts: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
