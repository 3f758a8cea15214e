"""Outcomes of the store's operations: returned as values, never raised.

The names are RocketMQ's (``PutMessageStatus``, ``AppendMessageStatus``, ``GetMessageStatus``)
so the broker can map them onto RocketMQ response codes one to one. ``DISK_FULL`` is Orbit's
own: RocketMQ folds it into SERVICE_NOT_AVAILABLE, which hides the reason from operators.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from data_plane.store.compiled import speedups

if TYPE_CHECKING:
    from data_plane.store._speedups import Appended

# The compiled Appender's answer type (``_speedups.Appended``: what one append wrote, by name),
# or None without the compiled module (then no append answers one).
APPENDED: type | None = getattr(speedups(), "Appended", None)

_new_object: Any = object.__new__


class PutMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    DISK_FULL = "DISK_FULL"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"

    @property
    def ok(self) -> bool:
        return self is PutMessageStatus.PUT_OK


class AppendMessageStatus(enum.Enum):
    """What one MappedFile said to an append."""

    PUT_OK = "PUT_OK"
    END_OF_FILE = "END_OF_FILE"
    MESSAGE_SIZE_EXCEEDED = "MESSAGE_SIZE_EXCEEDED"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


class AppendResult:
    """Where the append put the first (or only) message and how much it wrote. A plain class
    with positional arguments: it is built once per append, on the hottest path there is."""

    __slots__ = (
        "_host_hex",
        "_ids",
        "msg_num",
        "queue_offset",
        "status",
        "store_timestamp",
        "wrote_bytes",
        "wrote_offset",
    )

    def __init__(
        self,
        status: AppendMessageStatus,
        wrote_offset: int = 0,
        wrote_bytes: int = 0,
        store_timestamp: int = 0,
        queue_offset: int = 0,
        msg_num: int = 1,
        host_hex: str = "",
        ids: str = "",
    ) -> None:
        self.status = status
        self.wrote_offset = wrote_offset
        self.wrote_bytes = wrote_bytes
        self.store_timestamp = store_timestamp
        self.queue_offset = queue_offset
        self.msg_num = msg_num
        self._host_hex = host_hex
        self._ids = ids

    @property
    def msg_id(self) -> str:
        """The first message's id: store host and CommitLog offset as 32 hex digits."""
        return self._host_hex + format(self.wrote_offset, "016X")

    @property
    def msg_ids(self) -> str:
        """Every message's id, comma-joined (the answer to a batch). A batch's are taken by the
        append from the records it laid out; reading them back from the mapping would fault in
        pages the append only wrote with ``pwrite``."""
        return self._ids or self.msg_id

    def __repr__(self) -> str:
        return (
            f"AppendResult({self.status.value}, wrote_offset={self.wrote_offset}, wrote_bytes={self.wrote_bytes}, "
            f"queue_offset={self.queue_offset}, msg_num={self.msg_num})"
        )


class PutMessageResult:
    """The answer to a put. ``append`` says where it went; on the compiled single-message path
    it is built on first access from the compiled Appender's ``Appended``."""

    __slots__ = ("_append", "_host_hex", "_raw", "reason", "status")

    def __init__(self, status: PutMessageStatus, append: AppendResult | None = None, reason: str = "") -> None:
        self.status = status
        self._append = append
        self.reason = reason
        self._raw: Appended | None = None
        self._host_hex = ""

    @classmethod
    def stored(cls, raw: Appended, host_hex: str) -> PutMessageResult:
        """PUT_OK for one message appended at ``raw`` (the compiled Appender's answer)."""
        result: PutMessageResult = _new_object(cls)  # __init__'s work without its call: the hot path
        result.status = PutMessageStatus.PUT_OK
        result._append = None
        result.reason = ""
        result._raw = raw
        result._host_hex = host_hex
        return result

    @property
    def append(self) -> AppendResult | None:
        if self._append is None and self._raw is not None:
            raw = self._raw
            self._append = AppendResult(
                AppendMessageStatus.PUT_OK, raw.wrote_offset, raw.wrote_bytes, raw.store_timestamp, raw.queue_offset, 1,
                self._host_hex,
            )  # fmt: skip
        return self._append

    @append.setter
    def append(self, value: AppendResult | None) -> None:
        self._append = value
        self._raw = None

    @property
    def raw(self) -> Appended | None:
        """The compiled single-message path's ``Appended`` when this result came from it
        (``append`` is built from it), else None: the broker answers a send from it without building ``append``."""
        return self._raw

    def __repr__(self) -> str:
        return f"PutMessageResult({self.status.value}, {self.append!r}, reason={self.reason!r})"

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK


@dataclass(slots=True)
class GetMessageResult:
    """Messages of one queue, as memoryview slices of the CommitLog mapping (no copies): one
    slice per message, or — read with ``coalesce`` — one per run of records stored back to back;
    ``queue_offsets`` has one entry per message."""

    status: GetMessageStatus
    next_begin_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    messages: list[memoryview] = field(default_factory=list)
    queue_offsets: list[int] = field(default_factory=list)
    buffer_total_size: int = 0
    # True when the data read lies far behind the write point: a hint that a slave should serve
    # this consumer (seed 7.15).
    suggest_pulling_from_slave: bool = False
    # The read stopped at a tiered record not in memory (its CommitLog offset; -1: it did not):
    # ``await MessageStore.fetch_cold`` it and read again. Never on the wire.
    cold_offset: int = -1
    # Or at tiered ConsumeQueue units not in memory (their address for ``Tier.load_units``; -1:
    # it did not). ``await MessageStore.fetch_cold_read`` fetches whichever it was.
    cold_units: int = -1

    @property
    def cold(self) -> bool:
        return self.cold_offset >= 0 or self.cold_units >= 0

    @property
    def message_count(self) -> int:
        return len(self.queue_offsets)
