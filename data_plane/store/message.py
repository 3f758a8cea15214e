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

import re
import socket
import struct
from dataclasses import dataclass, field

from crc32c import crc32c

RECORD_HEADER = struct.Struct(">iiIiiqqiq8sq8siqi")
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

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7 as a Java int
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194 as a Java int
END_FILE_MIN_BLANK_LENGTH = 8

# Offsets of single fields inside a record, for readers that need one field only.
OFF_TOTAL_SIZE = 0
OFF_MAGIC = 4
OFF_BODY_CRC = 8
OFF_QUEUE_ID = 12
OFF_FLAG = 16
OFF_QUEUE_OFFSET = 20
OFF_PHYSICAL_OFFSET = 28
OFF_SYS_FLAG = 36
OFF_BORN_TIMESTAMP = 40
OFF_STORE_TIMESTAMP = 56
OFF_BODY_LENGTH = 84
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


def validate_topic(topic: str, max_length: int = 127) -> str | None:
    """Why ``topic`` cannot be stored, or None when it can."""
    if not topic:
        return "topic is empty"
    if len(topic) > max_length:
        return f"topic is {len(topic)} characters, more than {max_length}"
    if not VALID_TOPIC.fullmatch(topic):
        return f"topic {topic!r} has characters outside [%|a-zA-Z0-9_-]"
    return None


def validate_properties(properties: dict[str, str]) -> str | None:
    for k, v in properties.items():
        if not k:
            return "a property name is empty"
        if "\x01" in k or "\x02" in k or "\x01" in v or "\x02" in v:
            return f"property {k!r} holds a reserved separator character (\\x01 or \\x02)"
    return None


@dataclass(slots=True)
class Message:
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

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PROPERTY_KEYS)
        return [k for k in raw.split(KEY_SEPARATOR) if k] if raw else []


@dataclass(slots=True)
class StoredMessage:
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

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PROPERTY_KEYS)
        return [k for k in raw.split(KEY_SEPARATOR) if k] if raw else []


class RecordError(ValueError):
    """A record's bytes are not a well-formed message (torn, corrupt or not a record)."""


def decode_record(buf: bytes | memoryview, pos: int = 0, *, check_crc: bool = True) -> StoredMessage:
    """Decode the record at ``buf[pos:]``; raises ``RecordError`` when it is not whole and sound."""
    mv = memoryview(buf)
    if len(mv) - pos < RECORD_HEADER.size:
        raise RecordError("fewer bytes than a record header")
    (
        total,
        magic,
        crc,
        queue_id,
        flag,
        queue_offset,
        physical,
        sys_flag,
        born_ts,
        born_host,
        store_ts,
        store_host,
        reconsume,
        prepared,
        body_len,
    ) = RECORD_HEADER.unpack_from(mv, pos)
    if magic != MESSAGE_MAGIC_CODE:
        raise RecordError(f"bad magic code {magic:#x}")
    if sys_flag & (FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6):
        raise RecordError("IPv6 hosts are not supported in records")
    end = pos + total
    if total < RECORD_HEADER.size + 3 or end > len(mv) or body_len < 0:
        raise RecordError(f"total size {total} does not fit the buffer")
    p = pos + RECORD_HEADER.size
    if p + body_len + 3 > end:
        raise RecordError("body length runs past the record")
    body = bytes(mv[p : p + body_len])
    p += body_len
    topic_len = mv[p]
    p += 1
    if p + topic_len + 2 > end:
        raise RecordError("topic length runs past the record")
    try:
        topic = bytes(mv[p : p + topic_len]).decode()
    except UnicodeDecodeError:
        raise RecordError("topic is not UTF-8") from None
    p += topic_len
    (props_len,) = PROPS_LEN.unpack_from(mv, p)
    p += 2
    if props_len < 0 or p + props_len != end:
        raise RecordError("properties length does not end the record")
    if props_len and mv[end - 1] != 2:
        raise RecordError("properties do not end with their separator (torn record)")
    try:
        properties = decode_properties(mv[p : p + props_len])
    except UnicodeDecodeError:
        raise RecordError("properties are not UTF-8") from None
    if check_crc and body_crc(body) != crc:
        raise RecordError("body CRC mismatch")
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
