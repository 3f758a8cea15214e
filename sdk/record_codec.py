"""The SDK's record codecs: how a PULL body becomes MessageExt objects, a batch of Messages a
SEND_BATCH_MESSAGE body, a record's properties a dict, and how unique ids are numbered.

Two implementations satisfy ``data_plane.store.compiled.RecordCodec``, call for call: the
compiled ``_records`` module (used when it is built and ``ORBIT_PURE_PYTHON`` is not set) and
``PythonRecordCodec`` here, its twin and the reference. ``codec()`` answers the one in use:
``sdk.protocol`` decodes pull bodies and lays out batches through it; ``sdk.message`` takes
``unique_ids`` and ``properties_dict`` from the compiled module when it is built (the same
calls as here: ``sdk.message`` cannot import this module, which imports it). The twin tests
call both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from data_plane.remoting import bodies
from data_plane.store.compiled import RecordCodec, records
from data_plane.store.message import (
    FLAG_COMPRESSED,
    MESSAGE_MAGIC_CODE,
    PROPS_LEN,
    RECORD_HEADER,
    body_crc,
    decode_properties,
    encode_message_id,
)
from sdk.errors import IllegalMessageError
from sdk.message import Message, MessageExt, py_unique_ids

MAX_BATCH_ITEM_PROPERTIES_BYTES = 0xFFFF  # a batch message's properties: a 2-byte length
MAX_CACHED_TOPICS = 100_000  # decode_records' ``topics`` cache stops growing here
MAX_CACHED_HOSTS = 4096  # and its ``hosts`` cache is emptied past this


class Decoded(NamedTuple):
    """What ``decode_records`` answers: the records in order, and how many of them still carry
    a zlib-compressed body (the caller inflates those)."""

    messages: list[Any]
    compressed: int


class PythonRecordCodec:
    """The pure-Python ``RecordCodec``: ``_records.c`` does the same, byte for byte and error for
    error, at about a fifth of the cost."""

    RECORD_FIELDS: tuple[str, ...] = MessageExt.DECODED_SLOTS

    @staticmethod
    def unique_ids(head: str, counter: Iterator[int], n: int, /) -> list[str]:
        return py_unique_ids(head, counter, n)

    @staticmethod
    def properties_dict(raw: bytes, /) -> dict[str, str]:
        return decode_properties(raw)

    @staticmethod
    def decode_records(
        body: bytes | memoryview,
        cls: type,
        broker_name: str,
        check_crc: bool,
        topics: dict[bytes, str],
        hosts: dict[bytes, tuple[str, int]],
        host_of: Callable[[bytes], tuple[str, int]],
        /,
    ) -> Decoded:
        """The records of a PULL body, in order: one header unpack per record; magic, nested
        lengths, body CRC (with ``check_crc``) and properties ending with their separator
        checked; topics and hosts decoded once into the caller's caches. A record that is not
        sound raises ValueError naming its byte position. Compressed bodies are left as they
        came (``Decoded.compressed`` counts them)."""
        mv = memoryview(body)
        n = len(mv)
        out: list[Any] = []
        append = out.append
        unpack = RECORD_HEADER.unpack_from
        head = RECORD_HEADER.size
        props_len_at = PROPS_LEN.unpack_from
        compressed = pos = 0
        while pos < n:
            if n - pos < head:
                raise ValueError(f"pull body: record at byte {pos} is cut short")
            (
                total, magic, crc, queue_id, flag, queue_offset, physical, sys_flag, born_ts, born_host,
                store_ts, store_host, reconsume, _prepared, body_len,
            ) = unpack(mv, pos)  # fmt: skip
            end = pos + total
            p = pos + head
            if magic != MESSAGE_MAGIC_CODE or total < head + 3 or end > n or body_len < 0 or p + body_len + 3 > end:
                raise ValueError(f"pull body: record at byte {pos} is not sound (magic or sizes)")
            raw_body = mv[p : p + body_len]
            if check_crc and body_crc(raw_body) != crc:
                raise ValueError(f"pull body: record at byte {pos} fails its body CRC")
            p += body_len
            topic_len = mv[p]
            raw_topic = bytes(mv[p + 1 : p + 1 + topic_len])
            topic = topics.get(raw_topic)
            if topic is None:
                try:
                    topic = raw_topic.decode()
                except UnicodeDecodeError:
                    raise ValueError(f"pull body: record at byte {pos} has a topic that is not UTF-8") from None
                if len(topics) < MAX_CACHED_TOPICS:
                    topics[raw_topic] = topic
            p += 1 + topic_len
            if p + 2 > end:
                raise ValueError(f"pull body: record at byte {pos} is not sound (topic length)")
            (props_len,) = props_len_at(mv, p)
            p += 2
            if props_len < 0 or p + props_len != end or (props_len and mv[end - 1] != 2):
                raise ValueError(f"pull body: record at byte {pos} is not sound (properties)")
            try:
                props = decode_properties(mv[p:end]) if props_len else {}
            except (UnicodeDecodeError, ValueError) as e:
                raise ValueError(f"pull body: record at byte {pos} has bad properties: {e}") from None
            if sys_flag & FLAG_COMPRESSED:
                compressed += 1
            append(
                cls(
                    topic,
                    bytes(raw_body),
                    props,
                    queue_id,
                    queue_offset,
                    broker_name,
                    encode_message_id(store_host, physical),
                    physical,
                    born_ts,
                    _host(hosts, host_of, born_host),
                    store_ts,
                    _host(hosts, host_of, store_host),
                    reconsume,
                    sys_flag,
                    flag,
                    total,
                )
            )
            pos = end
        return Decoded(out, compressed)

    @staticmethod
    def plain_batch_body(msgs: Sequence[Message], unique_ids: Sequence[str], cls: type, /) -> bytes:
        """The SEND_BATCH_MESSAGE body of ``msgs``, each with its unique id (the compiled twin
        answers None for a batch that is not plain, and its caller then comes here)."""
        items = []
        for m, uid in zip(msgs, unique_ids, strict=True):
            props = m.encoded_properties(uid)
            if len(props) > MAX_BATCH_ITEM_PROPERTIES_BYTES:  # their length field has 2 bytes
                raise IllegalMessageError(
                    f"a batch message's properties are {len(props)} bytes, over {MAX_BATCH_ITEM_PROPERTIES_BYTES}"
                )
            items.append(bodies.encode_batch_item(m.body, 0, props))
        return b"".join(items)


def _host(
    hosts: dict[bytes, tuple[str, int]], host_of: Callable[[bytes], tuple[str, int]], raw: bytes
) -> tuple[str, int]:
    h = hosts.get(raw)
    if h is None:
        if len(hosts) > MAX_CACHED_HOSTS:
            hosts.clear()
        h = hosts[raw] = host_of(raw)
    return h


PYTHON: RecordCodec = PythonRecordCodec()


def compiled_codec() -> RecordCodec | None:
    """``_records`` when it is built, in use and made for this MessageExt's fields; else None."""
    mod = records()
    if mod is None or getattr(mod, "RECORD_FIELDS", None) != MessageExt.DECODED_SLOTS:
        return None
    return mod


def codec() -> RecordCodec:
    """The record codec in use: the compiled one when there is one, else the Python twin."""
    return compiled_codec() or PYTHON
