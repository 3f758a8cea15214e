"""Messages between the RocketMQ 5 API and the store: a v2 ``Message`` to the properties a
stored message carries, and a stored message back to a v2 ``Message`` with the system
properties the v5 clients read (id, digest, encoding, attempt, receipt handle, …)."""

from __future__ import annotations

import hashlib
import re
from typing import Any, Final

from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.store.message import (
    FLAG_COMPRESSED,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    StoredMessage,
)
from data_plane.tenancy.namespace import parse_wire_name

PROPERTY_MESSAGE_GROUP: Final = "__SHARDINGKEY"
PROPERTY_TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"
PROPERTY_TRACEPARENT: Final = "traceparent"
PROPERTY_PRODUCER_GROUP: Final = "PGROUP"
# Properties the broker and the 4.x protocol use themselves: not shown as user properties.
SYSTEM_PROPERTIES: Final = frozenset({
    PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, PROPERTY_MESSAGE_GROUP, PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_PRODUCER_GROUP, PROPERTY_TIMER_DELIVER_MS, "TIMER_OUT_MS", "TIMER_DELAY_MS", "TIMER_DELAY_SEC",
    "__STARTDELIVERTIME", "DELAY", "REAL_TOPIC", "REAL_QID", "WAIT", "MIN_OFFSET", "MAX_OFFSET", "CLUSTER",
    "MSG_REGION", "TRACE_ON", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "TRAN_PREPARED_QUEUE_OFFSET",
    "ORBIT_REPUT_FROM", "REAL_TOPIC_CHECK_TIMES", "TRANSACTION_CHECK_TIMES",
    "CHECK_IMMUNITY_TIME_IN_SECONDS", "V5_TYPE",
})  # fmt: skip
PROPERTY_V5_TYPE: Final = "V5_TYPE"  # the message type the v5 producer declared
# A tag may not hold "||" (the tag expression's separator) nor control characters.
TAG_RE: Final = re.compile(r"[^|\x00-\x1f]{1,128}")
PROPERTY_KEY_RE: Final = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
MAX_KEYS: Final = 32
MAX_PROPERTIES_BYTES: Final = 16 * 1024


_DECLARED_TYPES: Final = {str(t): t for t in (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)}


class MessageRefused(ValueError):
    """A v2 message this broker will not store; ``code`` is the v2 status code to answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def resource_of(wire: str) -> pb.Resource:
    """The v2 resource (namespace, name) of a wire name ``tenant%name``."""
    _special, tenant, name = parse_wire_name(wire)
    if tenant is None:
        return pb.Resource(name=wire)
    return pb.Resource(resource_namespace=tenant, name=name)


def to_properties(m: pb.Message, *, epoch_ms: int) -> tuple[dict[str, str], int]:
    """The stored properties of a v2 message, and its declared type; MessageRefused when it is
    not one the v5 rules allow (a FIFO message with no group, a delay with no time, …)."""
    sp = m.system_properties
    props = _user_properties(m) if m.user_properties else {}
    message_id = sp.message_id
    if not message_id or len(message_id) > 128 or _separated(message_id):
        raise MessageRefused(
            pb.ILLEGAL_MESSAGE_ID, "the message_id is empty, over 128 characters or holds \\x01 or \\x02"
        )
    props[PROPERTY_UNIQ_KEY] = message_id
    if sp.HasField("tag"):
        tag = sp.tag
        if not TAG_RE.fullmatch(tag):
            raise MessageRefused(pb.ILLEGAL_MESSAGE_TAG, f"tag {tag[:128]!r} is empty, too long or holds '|'")
        props[PROPERTY_TAGS] = tag
    keys = sp.keys
    if keys:
        if len(keys) > MAX_KEYS or any(not k or " " in k or len(k) > 128 or _separated(k) for k in keys):
            raise MessageRefused(
                pb.ILLEGAL_MESSAGE_KEY, "keys are 1 to 128 characters without spaces, \\x01 or \\x02, at most 32"
            )
        props[PROPERTY_KEYS] = " ".join(keys)
    mtype = sp.message_type or _NORMAL
    if mtype not in _TYPES:
        raise MessageRefused(pb.BAD_REQUEST, f"message type {pb.MessageType.Name(mtype)} is not supported here")
    if mtype != _NORMAL or sp.HasField("message_group") or sp.HasField("delivery_timestamp"):
        _typed_properties(sp, mtype, props, epoch_ms)  # (a NORMAL message with neither has none)
    if sp.HasField("trace_context"):
        trace = sp.trace_context
        if trace:
            if _separated(trace):
                raise MessageRefused(pb.BAD_REQUEST, "the trace context holds \\x01 or \\x02")
            props[PROPERTY_TRACEPARENT] = trace[:512]
    props[PROPERTY_V5_TYPE] = _TYPE_TEXT[mtype]
    return props, mtype


_NORMAL: Final = pb.NORMAL
_TYPES: Final = frozenset((pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION))
_TYPE_TEXT: Final = {t: str(t) for t in _TYPES}


def _separated(text: str) -> bool:
    """Whether ``text`` holds a stored properties separator (name \\x01 value \\x02): a value
    holding one would end its property early and start another."""
    return "\x01" in text or "\x02" in text


def _user_properties(m: pb.Message) -> dict[str, str]:
    props: dict[str, str] = {}
    if not m.user_properties:
        return props
    size = 0
    for k, v in m.user_properties.items():
        if not PROPERTY_KEY_RE.fullmatch(k) or k in SYSTEM_PROPERTIES:
            raise MessageRefused(pb.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property key {k[:64]!r} is not allowed")
        if _separated(v):
            raise MessageRefused(pb.BAD_REQUEST, f"the value of property {k!r} holds \\x01 or \\x02")
        size += len(k) + len(v)
        props[k] = v
    if size > MAX_PROPERTIES_BYTES:
        raise MessageRefused(
            pb.MESSAGE_PROPERTIES_TOO_LARGE, f"the properties take more than {MAX_PROPERTIES_BYTES} bytes"
        )
    return props


def _typed_properties(sp: pb.SystemProperties, mtype: int, props: dict[str, str], epoch_ms: int) -> None:
    """What a FIFO, delayed or transactional message carries besides (its group, its time)."""
    if sp.HasField("message_group"):
        if not sp.message_group or len(sp.message_group) > 128 or _separated(sp.message_group):
            raise MessageRefused(
                pb.ILLEGAL_MESSAGE_GROUP, "the message group is empty, over 128 characters or holds \\x01 or \\x02"
            )
        if mtype != pb.FIFO:
            raise MessageRefused(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "only a FIFO message has a message group")
        props[PROPERTY_MESSAGE_GROUP] = sp.message_group
    elif mtype == pb.FIFO:
        raise MessageRefused(pb.ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message group")
    if sp.HasField("delivery_timestamp"):
        ts = sp.delivery_timestamp
        # Clients that put milliseconds in the seconds field (the Python client's own tests do).
        due = ts.seconds if ts.seconds > 100_000_000_000 else ts.seconds * 1000 + ts.nanos // 1_000_000
        if mtype != pb.DELAY:
            raise MessageRefused(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "only a DELAY message has a delivery time")
        if due > epoch_ms:
            props[PROPERTY_TIMER_DELIVER_MS] = str(due)
    elif mtype == pb.DELAY:
        raise MessageRefused(pb.ILLEGAL_DELIVERY_TIME, "a DELAY message needs a delivery timestamp")
    if mtype == pb.TRANSACTION:
        props[PROPERTY_TRANSACTION_PREPARED] = "true"


def to_message(
    rec: StoredMessage,
    *,
    handle: str | None = None,
    attempt: int | None = None,
    invisible_ms: int | None = None,
    topic: pb.Resource | None = None,
    into: pb.Message | None = None,
) -> pb.Message:
    """The v2 form of a stored message, with its receipt handle and delivery attempt when it
    is handed out under a lease; ``topic``, the v2 resource of its topic when the caller has it;
    written into ``into`` (an empty message inside an answer) when given, rather than copied there."""
    m = pb.Message() if into is None else into
    props = rec.properties
    m.topic.CopyFrom(topic or resource_of(rec.topic))
    for k, v in props.items():
        if k not in SYSTEM_PROPERTIES and k != PROPERTY_TRACEPARENT:  # (the trace context's own field)
            m.user_properties[k] = v
    sp = m.system_properties
    sp.message_id = props.get(PROPERTY_UNIQ_KEY) or rec.msg_id
    digest = sp.body_digest
    digest.type = pb.MD5
    digest.checksum = hashlib.md5(rec.body, usedforsecurity=False).hexdigest().upper()
    sp.body_encoding = pb.GZIP if rec.flag & FLAG_COMPRESSED else pb.IDENTITY
    sp.born_host = rec.born_host[0]
    sp.store_host = f"{rec.store_host[0]}:{rec.store_host[1]}"
    sp.queue_id = rec.queue_id
    sp.queue_offset = rec.queue_offset
    _set_ms(sp.born_timestamp, rec.born_timestamp)
    _set_ms(sp.store_timestamp, rec.store_timestamp)
    tags = props.get(PROPERTY_TAGS)
    if tags is not None:
        sp.tag = tags
    keys = props.get(PROPERTY_KEYS)
    if keys:
        sp.keys.extend(keys.split())
    group = props.get(PROPERTY_MESSAGE_GROUP)
    declared = props.get(PROPERTY_V5_TYPE)
    if group is not None:
        sp.message_group = group
        sp.message_type = pb.FIFO
    elif declared in _DECLARED_TYPES:  # (any producer may set the property: only these count)
        sp.message_type = _DECLARED_TYPES[declared]
    else:
        sp.message_type = pb.NORMAL
    due = props.get("TIMER_OUT_MS") or props.get(PROPERTY_TIMER_DELIVER_MS)
    if due is not None and due.isdigit() and len(due) <= 15:  # (up to the year 33658)
        _set_ms(sp.delivery_timestamp, int(due))
    trace = props.get(PROPERTY_TRACEPARENT)
    if trace:
        sp.trace_context = trace
    if handle is not None:
        sp.receipt_handle = handle
    if attempt is not None:
        sp.delivery_attempt = attempt
    if invisible_ms is not None:
        d = sp.invisible_duration
        d.seconds, d.nanos = divmod(invisible_ms, 1000)
        d.nanos *= 1_000_000
    m.body = rec.body
    return m


def _set_ms(ts: Any, ms: int) -> None:
    """A Timestamp's fields from epoch milliseconds (``FromMilliseconds``, without its checks)."""
    ts.seconds, rest = divmod(ms, 1000)
    ts.nanos = rest * 1_000_000
