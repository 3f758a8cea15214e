"""The HA wire protocol: fixed big-endian frames on one TCP connection per slave.

A connection starts with the link's authentication — mutual, by HMAC-SHA256 over the broker
group's secret — then a handshake; after that the protocol is RocketMQ 4.x's: the slave reports
how far its CommitLog reaches as 8 bytes; the master streams its CommitLog from there as data
frames::

    master ─▶ slave, first frame on every connection: CHALLENGE
      +-------+---------+------+--------------+
      | magic | version | mode | master nonce |
      |   4   |    4    |  4   |      32      |
      +-------+---------+------+--------------+
      mode AUTH_HMAC (1): the slave proves it holds the group's secret (SLAVE_PROOF), then the
                          master proves it too (MASTER_PROOF); then HANDSHAKE
      mode AUTH_NONE (0): an unauthenticated link (no end has a secret): HANDSHAKE follows

    slave ─▶ master (AUTH_HMAC): SLAVE_PROOF
      +-------------+----------------------------------------------------------------------------+
      | slave nonce | HMAC-SHA256(secret, "orbit-ha slave" + group + master nonce + slave nonce) |
      |      32     |                                     32                                     |
      +-------------+----------------------------------------------------------------------------+

    master ─▶ slave, only once the slave's proof checked out: MASTER_PROOF
      +-----------------------------------------------------------------------------+
      | HMAC-SHA256(secret, "orbit-ha master" + group + master nonce + slave nonce) |
      |                                      32                                     |
      +-----------------------------------------------------------------------------+
      group: the broker group's name (RocketMQ's broker name), UTF-8; both nonces are 32 fresh
      random bytes per connection, so the HMAC's input is unambiguous (the variable part first)

    slave ─▶ master, once authenticated: HANDSHAKE
      +-------+---------+--------+------------+-------+----------------------------------------+
      | magic | version | member | max offset | count | count x candidate: offset | size | crc |
      |   4   |    4    |   4    |     8      |   4   |               8     |  4   |  4   |
      +-------+---------+--------+------------+-------+----------------------------------------+
      member: the slave's broker id (-1: not said), what the master's in-sync set names;
      candidates: the slave's last records (newest first), each as [offset, offset + size)
      of its log and the CRC-32C of those bytes (an end-of-file blank counts as a record)

    master ─▶ slave: HANDSHAKE_REPLY
      +------+--------+-------------------+-------+
      | code | offset | master max offset | epoch |
      |  4   |   8    |         8         |   8   |
      +------+--------+-------------------+-------+
      code STREAM (0): truncate to ``offset`` if the log is longer, then data follows from it
      code RETRY  (1): none of the candidates matched: truncate to ``offset`` (the oldest
                       candidate) and send a new HANDSHAKE
      epoch: the failover epoch this master serves (0 without failover); a slave refuses a
             master older than the epoch it knows of, before it truncates anything

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

The authentication's rules (docs/ha.md, "The HA link"):

* Fresh nonces from both ends: a recorded SLAVE_PROOF answers no other connection's challenge
  (no replay). Each proof names its side ("orbit-ha slave" / "orbit-ha master"), so neither can
  stand in for the other (no reflection); the group name binds it to one broker group.
* The master compares in constant time (``hmac.compare_digest``); a wrong proof, or none within
  the deadline (``AUTH_TIMEOUT_MS``), closes the connection without a MASTER_PROOF. Every read of
  the exchange has a fixed size. The slave takes no frame before the master's proof checked out.
* A slave with a secret refuses a master offering AUTH_NONE (no downgrade); a slave without one
  cannot answer AUTH_HMAC. The master counts a connection as a slave (what SYNC_MASTER sends
  wait for) only once authentication and handshake are done.
* Authenticated, not encrypted: the frames that follow travel in the clear and carry no MAC.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass

MAGIC = 0x4F524841  # "ORHA"
VERSION = 3

NONCE_BYTES = 32
MAC_BYTES = 32
CHALLENGE = struct.Struct(">III32s")
SLAVE_PROOF = struct.Struct(">32s32s")
MASTER_PROOF = struct.Struct(">32s")
AUTH_NONE = 0
AUTH_HMAC = 1
SLAVE_LABEL = b"orbit-ha slave"
MASTER_LABEL = b"orbit-ha master"
# The whole exchange (challenge to the master's proof) completes within this, or the link closes.
AUTH_TIMEOUT_MS = 5_000

HANDSHAKE_HEAD = struct.Struct(">IIiqI")
CANDIDATE = struct.Struct(">qII")
HANDSHAKE_REPLY = struct.Struct(">Iqqq")
REPORT = struct.Struct(">q")
DATA_HEADER = struct.Struct(">qI")

MAX_MEMBER_ID = 99  # broker ids of a group: 0 the master, 1..99 slaves

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


class LinkAuthError(ProtocolError):
    """The link's authentication failed (no secret, a wrong proof, none in time, a mode this
    side does not accept); the message says which, never the secret."""


@dataclass(frozen=True, slots=True)
class LinkAuth:
    """One end's part in the link's authentication: its broker group and the group's secret.

    ``secret`` is asked at every connection (a secret that arrives or changes later is used by
    the next one); None means not known yet: a master refuses every slave, a slave does not
    connect."""

    group: str
    secret: Callable[[], bytes | None]
    timeout_ms: int = AUTH_TIMEOUT_MS


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def encode_challenge(mode: int, nonce: bytes) -> bytes:
    return CHALLENGE.pack(MAGIC, VERSION, mode, nonce)


def decode_challenge(frame: bytes) -> tuple[int, bytes]:
    """(mode, master nonce) of a CHALLENGE; ProtocolError for another protocol or version."""
    magic, version, mode, nonce = CHALLENGE.unpack(frame)
    if magic != MAGIC or version != VERSION:
        raise ProtocolError(f"not an Orbit HA master of protocol {VERSION} (magic {magic:#x}, version {version})")
    if mode not in (AUTH_NONE, AUTH_HMAC):
        raise ProtocolError(f"unknown authentication mode {mode}")
    return mode, nonce


def _mac(label: bytes, secret: bytes, group: str, master_nonce: bytes, slave_nonce: bytes) -> bytes:
    return hmac.new(secret, label + group.encode() + master_nonce + slave_nonce, hashlib.sha256).digest()


def slave_proof(secret: bytes, group: str, master_nonce: bytes, slave_nonce: bytes) -> bytes:
    return _mac(SLAVE_LABEL, secret, group, master_nonce, slave_nonce)


def master_proof(secret: bytes, group: str, master_nonce: bytes, slave_nonce: bytes) -> bytes:
    return _mac(MASTER_LABEL, secret, group, master_nonce, slave_nonce)


def encode_slave_proof(secret: bytes, group: str, master_nonce: bytes, slave_nonce: bytes) -> bytes:
    """The slave's answer to a challenge carrying ``master_nonce``."""
    return SLAVE_PROOF.pack(slave_nonce, slave_proof(secret, group, master_nonce, slave_nonce))


def check_slave_proof(secret: bytes, group: str, master_nonce: bytes, frame: bytes) -> tuple[bytes, bytes] | None:
    """The master's check of a SLAVE_PROOF answering its challenge: (slave nonce, the
    MASTER_PROOF frame to send), or None when the proof is wrong."""
    slave_nonce, mac = SLAVE_PROOF.unpack(frame)
    expected = slave_proof(secret, group, master_nonce, slave_nonce)
    if not hmac.compare_digest(mac, expected) or hmac.compare_digest(slave_nonce, master_nonce):
        return None
    return slave_nonce, MASTER_PROOF.pack(master_proof(secret, group, master_nonce, slave_nonce))


def check_master_proof(secret: bytes, group: str, master_nonce: bytes, slave_nonce: bytes, frame: bytes) -> bool:
    """The slave's check of the master's MASTER_PROOF."""
    (mac,) = MASTER_PROOF.unpack(frame)
    return hmac.compare_digest(mac, master_proof(secret, group, master_nonce, slave_nonce))


def encode_handshake(max_offset: int, candidates: list[tuple[int, int, int]], member_id: int = -1) -> bytes:
    parts = [HANDSHAKE_HEAD.pack(MAGIC, VERSION, member_id, max_offset, len(candidates))]
    parts.extend(CANDIDATE.pack(o, n, c) for o, n, c in candidates)
    return b"".join(parts)
