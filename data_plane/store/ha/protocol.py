"""The HA wire protocol: fixed big-endian frames on one TCP connection per slave.

After a handshake, the protocol is RocketMQ 4.x's: the slave reports how far its CommitLog
reaches as 8 bytes; the master streams its CommitLog from there as data frames::

    slave ─▶ master, first frame: HANDSHAKE
      +-------+---------+------------+-------+----------------------------------------+
      | magic | version | max offset | count | count x candidate: offset | size | crc |
      |   4   |    4    |     8      |   4   |               8     |  4   |  4   |
      +-------+---------+------------+-------+----------------------------------------+
      candidates: the slave's last records (newest first), each as [offset, offset + size)
      of its log and the CRC-32C of those bytes (an end-of-file blank counts as a record)

    master ─▶ slave: HANDSHAKE_REPLY
      +------+--------+------------------+
      | code | offset | master max offset|
      |  4   |   8    |        8         |
      +------+--------+------------------+
      code STREAM (0): truncate to ``offset`` if the log is longer, then data follows from it
      code RETRY  (1): none of the candidates matched: truncate to ``offset`` (the oldest
                       candidate) and send a new HANDSHAKE

    slave ─▶ master, then: REPORT (RocketMQ's)      master ─▶ slave, then: DATA (RocketMQ's)
      +------------+                                 +------------+------+--------+
      | max offset |                                 | phy offset | size |  body  |
      |     8      |                                 |     8      |  4   | size   |
      +------------+                                 +------------+------+--------+
                                                     size 0: a heartbeat (body empty)

    Orbit's extension frames share those headers, told apart by a negative offset:
      master ─▶ slave  DATA with phy offset METADATA (-1): the body is the broker's metadata
                       (topics, subscription groups, consumer offsets, schedule progress) as JSON
      slave ─▶ master  REPORT of SLAVE_OFFSETS (-2), then [size 4][body]: consumer offsets that
                       clients committed on the slave while it could not reach the master, as JSON
"""

from __future__ import annotations

import struct

MAGIC = 0x4F524841  # "ORHA"
VERSION = 1

HANDSHAKE_HEAD = struct.Struct(">IIqI")
CANDIDATE = struct.Struct(">qII")
HANDSHAKE_REPLY = struct.Struct(">Iqq")
REPORT = struct.Struct(">q")
DATA_HEADER = struct.Struct(">qI")

METADATA = -1
SLAVE_OFFSETS = -2
LENGTH = struct.Struct(">I")
# A metadata or offsets document never exceeds this (topic tables of 10,000s of queues fit).
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024

REPLY_STREAM = 0
REPLY_RETRY = 1

MAX_CANDIDATES = 1024
# A data frame's body never exceeds this (a chunk never crosses a CommitLog file either).
MAX_CHUNK_BYTES = 16 * 1024 * 1024


class ProtocolError(Exception):
    """The peer sent something this side cannot accept; the connection is dropped."""


def encode_handshake(max_offset: int, candidates: list[tuple[int, int, int]]) -> bytes:
    parts = [HANDSHAKE_HEAD.pack(MAGIC, VERSION, max_offset, len(candidates))]
    parts.extend(CANDIDATE.pack(o, n, c) for o, n, c in candidates)
    return b"".join(parts)
