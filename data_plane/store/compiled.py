"""The compiled modules, one a layer, and the one place that loads them: the store's loops
(``data_plane.store._speedups``), the SDK's record codecs (``data_plane.store._records``),
the broker's batch decoding (``data_plane.broker._batch``) and the gRPC endpoint's batch sends
(``data_plane.proxy._v2_codec``). Each loader gives None when its
module is not built or ``ORBIT_PURE_PYTHON`` is set, and every user then takes the pure-Python
twin. Light on purpose: the SDK asks for ``records()`` without loading the store engine.

Each compiled module has a ``.pyi`` stub beside its C file and a Protocol that its pure-Python
twin implements call for call: ``StoreLoops`` (``_speedups``; ``fastpath.PythonLoops``),
``RecordCodec`` (``_records``; ``sdk.record_codec.PythonRecordCodec``) and ``BatchDecoder``
(``_batch``; ``broker.batch_decode.PythonBatchDecoder``) here, and ``FrameCodec`` (``_codec``;
``remoting.frame_codec.PythonFrameCodec``) beside the remoting codec, and ``V2Codec``
(``_v2_codec``; ``proxy.v2_codec.PythonV2Codec``). mypy checks every stub and
every twin against its Protocol (the block at the end, and each twin's module).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, cast


class StoreLoops(Protocol):
    """The write and read path's per-message loops (``data_plane/store/fastpath.py`` documents
    each; ``_speedups.c`` is their compiled twin, byte for byte)."""

    def write_batch(
        self,
        buf: memoryview,
        pos: int,
        limit: int,
        file_from: int,
        msgs: Any,
        topic_b: bytes,
        queue_id: int,
        first_qo: int,
        store_ts: int,
        store_host: bytes,
        max_props: int,
        max_msg: int,
        index_enabled: bool,
        cq_target: memoryview | None = ...,
        cq_pos: int = ...,
        cq_limit: int = ...,
        ix_target: memoryview | None = ...,
        ix_slots: int = ...,
        ix_count: int = ...,
        ix_max: int = ...,
        ix_begin_ts: int = ...,
        fd: int = ...,
        fd_offset: int = ...,
        /,
    ) -> Any: ...  # LaidOut, NeedsRoom, Refused (fastpath.py) or None

    def index_write(
        self, buf: memoryview, slots: int, count: int, max_entries: int, begin_ts: int, store_ts: int, items: bytes,
        start: int, /,
    ) -> tuple[int, int, int]: ...  # IndexWritten (fastpath.py) or its struct sequence  # fmt: skip

    def collect_units(
        self, units: Any, i: int, n: int, cur: memoryview | None, cur_from: int, cur_end: int, log_min: int,
        max_nums: int, max_bytes: int, total_bytes: int, tags_codes: Any, messages: list[memoryview],
        queue_offsets: list[int], first_queue_offset: int, coalesce: bool = ..., /,
    ) -> tuple[int, int, int, int]: ...  # UnitsCollected (fastpath.py) or its struct sequence  # fmt: skip

    def plain_batch(
        self, body: bytes | memoryview, max_messages: int, skip: tuple[bytes, ...], /
    ) -> tuple[int, int] | None: ...  # PlainCounts (fastpath.py) or its struct sequence, or None

    def plain_properties(self, properties: str | bytes, skip: tuple[bytes, ...], /) -> bool: ...

    def batch_ids(self, buf: Any, file_from: int, offset: int, n: int, prefix: str, /) -> str | None: ...


class RecordCodec(Protocol):
    """The SDK's record codecs (twin: ``sdk.record_codec.PythonRecordCodec``)."""

    RECORD_FIELDS: tuple[str, ...]

    def unique_ids(self, head: str, counter: Iterator[int], n: int, /) -> list[str]: ...

    def properties_dict(self, raw: bytes, /) -> dict[str, str]: ...

    def decode_records(
        self, body: bytes | memoryview, cls: type, broker_name: str, check_crc: bool, topics: dict[bytes, str],
        hosts: dict[bytes, tuple[str, int]], host_of: Any, /,
    ) -> tuple[list[Any], int]: ...  # fmt: skip

    def plain_batch_body(self, msgs: list[Any], unique_ids: list[str], cls: type, /) -> bytes | None: ...


class BatchDecoder(Protocol):
    """The broker's SEND_BATCH_MESSAGE decoding (twin: ``data_plane.broker.batch_decode.PythonBatchDecoder``)."""

    def batch_messages(
        self, body: bytes | memoryview, cls: type, topic: str, queue_id: int, sys_flag: int, born_ts: int,
        born_host: bytes, reconsume: int, max_messages: int, /,
    ) -> list[Any] | None: ...  # fmt: skip


class V2Codec(Protocol):
    """The gRPC endpoint's SendMessageRequest to batch body, the leasing of a receive's new records and
    stored records to received messages (twin: ``data_plane.proxy.v2_codec.PythonV2Codec``)."""

    def plain_batch(
        self, payload: bytes | memoryview, max_messages: int, max_body: int, now_ms: int, /
    ) -> tuple[str, str, bytes, list[str], int, int] | None: ...  # PlainBatch (v2_codec.py), or None

    def received_records(
        self, records: list[Any], topic: str, namespace: str, name: str, queue_id: int, seq: int, attempt: int,
        invisible_ms: int, system_names: frozenset[str], /,
    ) -> list[bytes | None]: ...  # fmt: skip

    def lease_scan(
        self, records: list[Any], topic: str, leases: dict[int, Any], done: set[int], tags: frozenset[str] | None,
        want: int, lease: Any, /,
    ) -> tuple[list[int], list[Any], list[int], int, int, int]: ...  # fmt: skip


def _load(name: str) -> Any:
    if os.environ.get("ORBIT_PURE_PYTHON"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # not built (no compiler): the twins serve
        return None


def speedups() -> Any:
    """``_speedups`` (the store's loops and its Appender, StoreEntry and position types) when
    built and in use, else None."""
    return _load("data_plane.store._speedups")


def records() -> RecordCodec | None:
    """``_records`` (the SDK's record codecs) when built and in use, else None."""
    return cast("RecordCodec | None", _load("data_plane.store._records"))


def batch() -> BatchDecoder | None:
    """``data_plane.broker._batch`` (the broker's batch decoding) when built and in use, else None."""
    return cast("BatchDecoder | None", _load("data_plane.broker._batch"))


def v2_codec() -> V2Codec | None:
    """``data_plane.proxy._v2_codec`` (the gRPC endpoint's batch sends) when built and in use, else None."""
    return cast("V2Codec | None", _load("data_plane.proxy._v2_codec"))


if TYPE_CHECKING:  # each stub satisfies its Protocol
    from data_plane.broker import _batch
    from data_plane.proxy import _v2_codec
    from data_plane.store import _records, _speedups
    from data_plane.store.fastpath import PythonLoops

    _loops: StoreLoops = _speedups
    _py_loops: StoreLoops = PythonLoops()
    _codec: RecordCodec = _records
    _decoder: BatchDecoder = _batch
    _v2: V2Codec = _v2_codec
