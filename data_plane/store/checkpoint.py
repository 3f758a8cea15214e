"""StoreCheckpoint and the abort file: where recovery may start.

    checkpoint (one 4 KiB file, the first 52 bytes used):
    +---------------------+---------------------+---------------------+
    | physic msg ts 8     | logics msg ts 8     | index msg ts 8      |   RocketMQ's three
    +---------------------+---------------------+---------------------+
    | physic offset 8     | logics offset 8     | index offset 8      |   Orbit: exact offsets
    +---------------------+---------------------+---------------------+
    | CRC-32C of the 48 bytes before 4 |
    +----------------------------------+

``physic offset``: the CommitLog is durable below it. ``logics offset``: every ConsumeQueue unit
for records below it is durable. ``index offset``: likewise for IndexFile entries. A checkpoint
whose CRC does not match (torn write) is ignored and recovery starts from the first file.

The abort file exists while the store runs; finding it at start means the last stop was a crash.
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass

from crc32c import crc32c

CHECKPOINT = struct.Struct(">qqqqqqI")
assert CHECKPOINT.size == 52, CHECKPOINT.size
CHECKPOINT_FILE_SIZE = 4096


@dataclass(slots=True)
class StoreCheckpoint:
    path: str
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    physic_offset: int = 0
    logics_offset: int = 0
    index_offset: int = 0
    valid: bool = False  # a sound checkpoint was read at load

    @classmethod
    def load(cls, path: str) -> StoreCheckpoint:
        cp = cls(path)
        try:
            with open(path, "rb") as f:
                raw = f.read(CHECKPOINT.size)
        except FileNotFoundError:
            return cp
        if len(raw) < CHECKPOINT.size:
            return cp
        *values, crc = CHECKPOINT.unpack(raw)
        if crc32c(raw[:48]) != crc:
            return cp
        (
            cp.physic_msg_timestamp,
            cp.logics_msg_timestamp,
            cp.index_msg_timestamp,
            cp.physic_offset,
            cp.logics_offset,
            cp.index_offset,
        ) = values
        cp.valid = True
        return cp

    def min_offset(self) -> int:
        """Below this offset every structure is durable."""
        return min(self.physic_offset, self.logics_offset, self.index_offset)

    def flush(self) -> None:
        head = struct.pack(
            ">qqqqqq",
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.physic_offset,
            self.logics_offset,
            self.index_offset,
        )
        data = head + struct.pack(">I", crc32c(head))
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < CHECKPOINT_FILE_SIZE:
                os.ftruncate(fd, CHECKPOINT_FILE_SIZE)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)


def create_abort_file(path: str) -> bool:
    """Create the abort file; True when it was already there (the last stop was a crash)."""
    existed = os.path.exists(path)
    with open(path, "wb") as f:
        f.flush()
        os.fsync(f.fileno())
    return existed


def delete_abort_file(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
