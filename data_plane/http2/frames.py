"""HTTP/2 frames (RFC 9113 section 4): the nine-byte header, the frame types, flags, settings and
error codes the gRPC endpoint uses, and encoders for the frames it writes.

    +-----------------------------------------------+
    |                 Length (24)                   |
    +---------------+---------------+---------------+
    |   Type (8)    |   Flags (8)   |
    +-+-------------+---------------+-------------------------------+
    |R|                 Stream Identifier (31)                      |
    +=+=============================================================+
    |                   Frame Payload (0...)                      ...
    +---------------------------------------------------------------+

``FRAME_HEADER`` reads the length and type as one 32-bit word (length << 8 | type).
"""

from __future__ import annotations

import struct
from typing import Final

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

FRAME_HEADER: Final = struct.Struct(">IBI")
FRAME_HEADER_SIZE: Final = 9
assert FRAME_HEADER.size == FRAME_HEADER_SIZE

# Frame types.
DATA: Final = 0x0
HEADERS: Final = 0x1
PRIORITY: Final = 0x2
RST_STREAM: Final = 0x3
SETTINGS: Final = 0x4
PUSH_PROMISE: Final = 0x5
PING: Final = 0x6
GOAWAY: Final = 0x7
WINDOW_UPDATE: Final = 0x8
CONTINUATION: Final = 0x9

# Flags.
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20

# Settings identifiers.
SETTINGS_HEADER_TABLE_SIZE: Final = 0x1
SETTINGS_ENABLE_PUSH: Final = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS: Final = 0x3
SETTINGS_INITIAL_WINDOW_SIZE: Final = 0x4
SETTINGS_MAX_FRAME_SIZE: Final = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE: Final = 0x6

# Error codes (RST_STREAM, GOAWAY).
NO_ERROR: Final = 0x0
PROTOCOL_ERROR: Final = 0x1
INTERNAL_ERROR: Final = 0x2
FLOW_CONTROL_ERROR: Final = 0x3
STREAM_CLOSED: Final = 0x5
FRAME_SIZE_ERROR: Final = 0x6
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8
COMPRESSION_ERROR: Final = 0x9
ENHANCE_YOUR_CALM: Final = 0xB

DEFAULT_WINDOW: Final = 65_535
MAX_WINDOW: Final = (1 << 31) - 1
DEFAULT_MAX_FRAME_SIZE: Final = 16_384
LARGEST_MAX_FRAME_SIZE: Final = (1 << 24) - 1

SETTING: Final = struct.Struct(">HI")
U32: Final = struct.Struct(">I")
GOAWAY_HEAD: Final = struct.Struct(">II")
PRIORITY_FIELDS_SIZE: Final = 5


class ConnectionError_(Exception):
    """A connection error (RFC 9113 section 5.4.1): the connection ends with GOAWAY ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return FRAME_HEADER.pack(len(payload) << 8 | kind, flags, stream_id) + payload


def frame_head(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    return FRAME_HEADER.pack(length << 8 | kind, flags, stream_id)


def settings(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(SETTING.pack(k, v) for k, v in values.items()))


SETTINGS_ACK: Final = frame(SETTINGS, ACK, 0)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, GOAWAY_HEAD.pack(last_stream_id, code) + debug[:256])


def parse_settings(payload: bytes | memoryview) -> list[tuple[int, int]]:
    if len(payload) % 6:
        raise ConnectionError_(FRAME_SIZE_ERROR, "a SETTINGS frame's length is not a multiple of 6")
    out = [SETTING.unpack_from(payload, i) for i in range(0, len(payload), 6)]
    for key, value in out:
        if key == SETTINGS_ENABLE_PUSH and value > 1:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH is not 0 or 1")
        if key == SETTINGS_INITIAL_WINDOW_SIZE and value > MAX_WINDOW:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE is above 2^31-1")
        if key == SETTINGS_MAX_FRAME_SIZE and not DEFAULT_MAX_FRAME_SIZE <= value <= LARGEST_MAX_FRAME_SIZE:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE is outside 16384 .. 2^24-1")
    return out


def strip_padding(flags: int, payload: memoryview) -> memoryview:
    """A DATA or HEADERS payload without its padding (the PADDED flag's length byte and pad)."""
    if not flags & PADDED:
        return payload
    if not payload:
        raise ConnectionError_(PROTOCOL_ERROR, "a padded frame has no pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ConnectionError_(PROTOCOL_ERROR, "a frame's padding is as long as its payload")
    return payload[1 : len(payload) - pad]
