"""Answers written straight in protobuf's wire format where the endpoint writes many of them:
a SendMessageResponse and an AckMessageResponse whose every entry is OK, one entry per message.
They are the same bytes ``SendMessageResponse(status=OK, entries=[...]).SerializeToString()``
(and the AckMessageResponse's) give (``tests/unit/test_proxy_answers.py``), without a message
object per entry.

    SendMessageResponse    1: status (Status)   2: entries (SendResultEntry, repeated)
    SendResultEntry        1: status (Status)   2: message_id (string)   4: offset (int64)
    AckMessageResponse     1: status (Status)   2: entries (AckMessageResultEntry, repeated)
    AckMessageResultEntry  1: message_id (string)   2: receipt_handle (string)   3: status (Status)
    Status                 1: code (enum)       2: message (string)
"""

from __future__ import annotations

from typing import Final

from data_plane.proxy.v2 import definition_pb2 as pb


def varint(value: int) -> bytes:
    """A base-128 varint, as protobuf writes lengths, tags and integers."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


_OK_STATUS: Final = varint(1 << 3) + varint(pb.OK) + _field(2, b"OK")
_OK_STATUS_FIELD: Final = _field(1, _OK_STATUS)  # (field 1 of both the response and an entry)
_FIELD_2: Final = varint(2 << 3 | 2)  # (an entry's message_id, and the response's entries)
_OFFSET_TAG: Final = varint(4 << 3)
_FIELD_1: Final = varint(1 << 3 | 2)
_OK_STATUS_FIELD_3: Final = varint(3 << 3 | 2) + varint(len(_OK_STATUS)) + _OK_STATUS
_ONE_BYTE: Final = tuple(bytes((i,)) for i in range(128))


def send_ok(entries: list[tuple[str, int]]) -> bytes:
    """A SendMessageResponse with status OK and an OK entry (message id, queue offset) each."""
    parts = [_OK_STATUS_FIELD]
    for message_id, offset in entries:
        mid = message_id.encode()
        # (proto3 leaves out an empty string and a zero)
        idf = _FIELD_2 + _length(len(mid)) + mid if mid else b""
        off = _OFFSET_TAG + varint(offset) if offset else b""
        body = _OK_STATUS_FIELD + idf + off
        parts += (_FIELD_2, _length(len(body)), body)
    return b"".join(parts)


def ack_ok(entries: list[tuple[str, str]]) -> bytes:
    """An AckMessageResponse with status OK and an OK entry (message id, receipt handle) each."""
    parts = [_OK_STATUS_FIELD]
    for message_id, handle in entries:
        mid, h = message_id.encode(), handle.encode()
        body = b"".join((
            _FIELD_1 + _length(len(mid)) + mid if mid else b"",
            _FIELD_2 + _length(len(h)) + h if h else b"",
            _OK_STATUS_FIELD_3,
        ))  # fmt: skip
        parts += (_FIELD_2, _length(len(body)), body)
    return b"".join(parts)


def _length(n: int) -> bytes:
    return _ONE_BYTE[n] if n < 128 else varint(n)
