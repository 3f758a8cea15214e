"""The CommitLog record: RocketMQ 4.x's message layout, byte for byte.

One record, big-endian, as written by ``CommitLog`` and shipped unchanged in PULL responses::

    +--------+--------+--------+--------+--------+-----------+-----------+--------+
    | total  | magic  | body   | queue  | flag   | queue     | physical  | sys    |
    | size 4 | code 4 | CRC 4  | id 4   | 4      | offset 8  | offset 8  | flag 4 |
    +--------+--------+--------+--------+--------+-----------+-----------+--------+
    | born       | born host   | store      | store host  | reconsume | prepared tx |
    | timestamp 8| ip 4 port 4 | timestamp 8| ip 4 port 4 | times 4   | offset 8    |
    +------------+-------------+------------+-------------+-----------+-------------+
    | body length 4 | body ... | topic length 1 | topic ... | props length 2 | props |
    +---------------+----------+----------------+-----------+----------------+-------+

The fixed part is 88 bytes (``RECORD_HEADER``). The body CRC is CRC-32C of the body masked to
31 bits (RocketMQ masks its CRC-32 the same way; Orbit uses the Castagnoli polynomial because
the CPU computes it). Properties are ``name \\x01 value \\x02`` repeated, RocketMQ's encoding.

A file that cannot hold the next record ends with a blank record: total size = the bytes left
in the file, magic = ``BLANK_MAGIC_CODE``; ``END_FILE_MIN_BLANK_LENGTH`` (8) bytes always stay free
for it.

Message id (RocketMQ's "offset message id"): 16 bytes = store IPv4 4 + store port 4 + CommitLog
offset 8, written as 32 upper-case hex digits.
"""

from __future__ import annotations

import operator
import re
import socket
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from crc32c import crc32c

from data_plane.store import layouts

RECORD_HEADER = layouts.RECORD_HEADER  # (the one definition, shared with the C modules)
assert RECORD_HEADER.size == 88, RECORD_HEADER.size
TOTAL_SIZE = struct.Struct(">i")
MAGIC_AND_SIZE = struct.Struct(">ii")
assert MAGIC_AND_SIZE.size == 8
TOPIC_LEN = struct.Struct(">B")
PROPS_LEN = struct.Struct(">h")
HOST = struct.Struct(">4si")
assert HOST.size == 8
MESSAGE_ID = struct.Struct(">4siq")
assert MESSAGE_ID.size == 16

MESSAGE_MAGIC_CODE = layouts.MESSAGE_MAGIC_CODE
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194 as a Java int
END_FILE_MIN_BLANK_LENGTH = 8

# Offsets of single fields inside a record, for readers that need one field only.
OFF_TOTAL_SIZE = layouts.offset("RECORD_HEADER", "TOTAL_SIZE")
OFF_MAGIC = layouts.offset("RECORD_HEADER", "MAGIC")
OFF_BODY_CRC = layouts.offset("RECORD_HEADER", "BODY_CRC")
OFF_QUEUE_ID = layouts.offset("RECORD_HEADER", "QUEUE_ID")
OFF_FLAG = layouts.offset("RECORD_HEADER", "FLAG")
OFF_QUEUE_OFFSET = layouts.offset("RECORD_HEADER", "QUEUE_OFFSET")
OFF_PHYSICAL_OFFSET = layouts.offset("RECORD_HEADER", "PHYSICAL_OFFSET")
OFF_SYS_FLAG = layouts.offset("RECORD_HEADER", "SYS_FLAG")
OFF_BORN_TIMESTAMP = layouts.offset("RECORD_HEADER", "BORN_TIMESTAMP")
OFF_STORE_TIMESTAMP = layouts.offset("RECORD_HEADER", "STORE_TIMESTAMP")
OFF_BODY_LENGTH = layouts.offset("RECORD_HEADER", "BODY_LENGTH")
STORE_TIMESTAMP = struct.Struct(">q")

# sys flag bits (MessageSysFlag)
FLAG_COMPRESSED = 0x1
FLAG_MULTI_TAGS = 0x2
TRANSACTION_NOT_TYPE = 0
TRANSACTION_PREPARED_TYPE = 0x1 << 2
TRANSACTION_COMMIT_TYPE = 0x2 << 2
TRANSACTION_ROLLBACK_TYPE = 0x3 << 2
TRANSACTION_TYPE_MASK = 0x3 << 2
FLAG_BORNHOST_V6 = 0x1 << 4
FLAG_STOREHOST_V6 = 0x1 << 5

# Well-known property names (MessageConst)
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
KEY_SEPARATOR = " "
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

_HEX32 = re.compile(r"[0-9A-Fa-f]{32}")
VALID_TOPIC = re.compile(r"[%|a-zA-Z0-9_-]+")


def pack_host(ip: str, port: int) -> bytes:
    """An IPv4 address and port as the 8 bytes a record and a message id carry."""
    return HOST.pack(socket.inet_aton(ip), port)


def unpack_host(raw: bytes | memoryview) -> tuple[str, int]:
    ip, port = HOST.unpack(raw)
    return socket.inet_ntoa(ip), port


def body_crc(body: bytes | memoryview) -> int:
    return crc32c(body) & 0x7FFFFFFF


def encode_message_id(host: bytes, commit_log_offset: int) -> str:
    return host.hex().upper() + format(commit_log_offset, "016X")


def decode_message_id(msg_id: str) -> tuple[str, int, int]:
    """``(store ip, store port, commit log offset)`` of a 32-hex-digit message id."""
    if len(msg_id) != 32:
        raise ValueError(f"a message id is 32 hex digits, got {len(msg_id)} characters")
    if not _HEX32.fullmatch(msg_id):
        raise ValueError(f"a message id is hex digits only: {msg_id!r}")
    raw = bytes.fromhex(msg_id)
    ip, port, offset = MESSAGE_ID.unpack(raw)
    return socket.inet_ntoa(ip), port, offset


_tags_codes: dict[str, int] = {}


def tags_hash_code(tags: str) -> int:
    """Java's ``String.hashCode`` of the tag: what stock RocketMQ clients put in ``codeSet``."""
    code = _tags_codes.get(tags)
    if code is None:
        h = 0
        for unit in struct.unpack(f">{len(tags.encode('utf-16-be')) // 2}H", tags.encode("utf-16-be")):
            h = (31 * h + unit) & 0xFFFFFFFF
        code = h - 0x100000000 if h >= 0x80000000 else h
        if len(_tags_codes) < 65536:
            _tags_codes[tags] = code
    return code


def encode_properties(properties: dict[str, str]) -> bytes:
    if not properties:
        return b""
    return "".join([f"{k}\x01{v}\x02" for k, v in properties.items()]).encode()


def decode_properties(raw: bytes | memoryview | str) -> dict[str, str]:
    text = raw if isinstance(raw, str) else bytes(raw).decode()
    out: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        if item:
            name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
            if sep:
                out[name] = value
    return out


def record_starts(runs: Iterable[memoryview]) -> Iterator[tuple[memoryview, int]]:
    """``(run, position)`` of every record in ``runs``: slices of whole records back to back,
    as a coalesced read (``MessageStore.get_message(coalesce=True)``) hands them out. Each record
    starts with its total size; the walk stops at one that is not positive."""
    for run in runs:
        at, end = 0, len(run)
        while at + 4 <= end:
            (size,) = TOTAL_SIZE.unpack_from(run, at)
            if size <= 0:
                break
            yield run, at
            at += size


def validate_topic(topic: str, max_length: int = 127) -> str | None:
    """Why ``topic`` cannot be stored, or None when it can."""
    if not topic:
        return "topic is empty"
    if len(topic) > max_length:
        return f"topic is {len(topic)} characters, more than {max_length}"
    if not VALID_TOPIC.fullmatch(topic):
        return f"topic {topic!r} has characters outside [%|a-zA-Z0-9_-]"
    return None


class _TagsAndKeys:
    """``tags`` and ``keys`` read from the properties (RocketMQ's TAGS and KEYS)."""

    __slots__ = ()
    properties: dict[str, str]

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PROPERTY_KEYS)
        return [k for k in raw.split(KEY_SEPARATOR) if k] if raw else []


@dataclass(slots=True)
class Message(_TagsAndKeys):
    """A message as handed to the store. ``born_host`` is ``pack_host(ip, port)``."""

    topic: str
    body: bytes
    queue_id: int = 0
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x00\x00"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


# Field readers for map(): a batch's messages looked at in C instead of a Python loop a message.
topic_of = operator.attrgetter("topic")
queue_id_of = operator.attrgetter("queue_id")
properties_of = operator.attrgetter("properties")


@dataclass(slots=True)
class StoredMessage(_TagsAndKeys):
    """A record read back from the CommitLog, every field decoded (RocketMQ's MessageExt)."""

    total_size: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    commit_log_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_timestamp: int
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]

    @property
    def msg_id(self) -> str:
        return encode_message_id(pack_host(*self.store_host), self.commit_log_offset)


class RecordError(ValueError):
    """A record's bytes are not a well-formed message (torn, corrupt or not a record)."""


class ParsedRecord(NamedTuple):
    """The fields of a record whose shape was verified (``parse_record``)."""

    header: tuple[Any, ...]  # RECORD_HEADER's 15 fields, in order
    body_at: int  # the body is buf[body_at : body_at + header[14]]
    topic: str
    properties: memoryview  # name\x01value\x02... (not yet decoded)


def parse_record(buf: bytes | memoryview, pos: int = 0, *, check_crc: bool = True) -> ParsedRecord:
    """Verify the record at ``buf[pos:]`` — magic, lengths that nest exactly, body CRC, a valid
    topic, properties that end with their separator (a torn tail leaves zeros) — and split it.
    Raises ``RecordError`` when it is not whole and sound. Recovery and reads share this."""
    mv = memoryview(buf)
    if len(mv) - pos < RECORD_HEADER.size:
        raise RecordError("fewer bytes than a record header")
    header = RECORD_HEADER.unpack_from(mv, pos)
    total, magic, crc, sys_flag, body_len = header[0], header[1], header[2], header[7], header[14]
    if magic != MESSAGE_MAGIC_CODE:
        raise RecordError(f"bad magic code {magic:#x}")
    if sys_flag & (FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6):
        raise RecordError("IPv6 hosts are not supported in records")
    end = pos + total
    if total < RECORD_HEADER.size + 3 or end > len(mv):
        raise RecordError(f"total size {total} does not fit the buffer")
    body_at = p = pos + RECORD_HEADER.size
    if body_len < 0 or p + body_len + 3 > end:
        raise RecordError("body length runs past the record")
    if check_crc and body_crc(mv[p : p + body_len]) != crc:
        raise RecordError("body CRC mismatch")
    p += body_len
    topic_len = mv[p]
    p += 1
    if p + topic_len + 2 > end:
        raise RecordError("topic length runs past the record")
    try:
        topic = bytes(mv[p : p + topic_len]).decode()
    except UnicodeDecodeError:
        raise RecordError("topic is not UTF-8") from None
    if not VALID_TOPIC.fullmatch(topic):
        raise RecordError(f"topic {topic!r} is not a valid topic (torn or corrupt record)")
    p += topic_len
    (props_len,) = PROPS_LEN.unpack_from(mv, p)
    p += 2
    if props_len < 0 or p + props_len != end:
        raise RecordError("properties length does not end the record")
    if props_len and mv[end - 1] != 2:
        # Properties always end with the separator: a record whose tail did not reach the disk
        # (a torn write leaves zeros) fails here even though its body CRC is sound.
        raise RecordError("properties do not end with their separator (torn record)")
    return ParsedRecord(header, body_at, topic, mv[p:end])


def decode_record(buf: bytes | memoryview, pos: int = 0, *, check_crc: bool = True) -> StoredMessage:
    """Decode the record at ``buf[pos:]``; raises ``RecordError`` when it is not whole and sound."""
    parsed = parse_record(buf, pos, check_crc=check_crc)
    (
        total, _magic, crc, queue_id, flag, queue_offset, physical, sys_flag, born_ts, born_host,
        store_ts, store_host, reconsume, prepared, body_len,
    ) = parsed.header  # fmt: skip
    try:
        properties = decode_properties(parsed.properties)
    except UnicodeDecodeError:
        raise RecordError("properties are not UTF-8") from None
    body = bytes(memoryview(buf)[parsed.body_at : parsed.body_at + body_len])
    topic = parsed.topic
    return StoredMessage(
        total_size=total,
        body_crc=crc,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        commit_log_offset=physical,
        sys_flag=sys_flag,
        born_timestamp=born_ts,
        born_host=unpack_host(born_host),
        store_timestamp=store_ts,
        store_host=unpack_host(store_host),
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body=body,
        topic=topic,
        properties=properties,
    )
