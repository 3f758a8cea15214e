"""The gRPC endpoint's hottest conversions, straight between protobuf's wire format and the
store's: a SendMessageRequest of plain messages of one topic read into the body of one
SEND_BATCH_MESSAGE (layout in ``data_plane/remoting/bodies.py``); a receive's new records of a
queue leased in one pass (``PopService``'s scan); and stored records written as the framed
ReceiveMessageResponses that hand them out under a lease.

Two implementations satisfy ``data_plane.store.compiled.V2Codec``: the compiled
``_v2_codec.c``, which does all three without a protobuf object, a decoded message or a
properties dict per message, and ``PythonV2Codec`` here, the reference: the request parsed and
each message through ``messages.to_properties`` and ``encode_batch_item``, as
``service.MessagingService`` stores a batch; each record decoded (``decode_record``), judged as
``PopService`` judges it, and written by ``messages.to_message``. The endpoint and the lease
book take the compiled one when it is built; without it, their own paths serve, which this twin
restates. The compiled one answers None (or stops) where it leaves the rest to those paths.

"Plain" is what the batch path stores without a question: NORMAL messages of one
topic (a single one too, stored as a batch of one: the record the single path writes), none
with user properties, a message group or a delivery time, each one the v5 rules accept.
Anything else is None, and the service parses the request and judges each message.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from google.protobuf.message import DecodeError

from data_plane.broker.pop import handle_of
from data_plane.http2.grpc_server import framed
from data_plane.proxy.messages import MessageRefused, to_message, to_properties
from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.proxy.v2 import service_pb2 as rpc
from data_plane.remoting.bodies import encode_batch_item
from data_plane.store.compiled import V2Codec, v2_codec
from data_plane.store.message import (
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    RecordError,
    decode_properties,
    decode_record,
    encode_properties,
    parse_record,
)


class PlainBatch(NamedTuple):
    namespace: str  # the topic's resource_namespace, as the messages give it
    name: str
    items: bytes  # a SEND_BATCH_MESSAGE body: one item per message, in order
    message_ids: list[str]
    born_ms: int  # the first message's born time (the batch's), or the time given when it has none
    body_bytes: int  # the bodies' bytes, for metering


class PythonV2Codec:
    """The pure-Python ``V2Codec``."""

    @staticmethod
    def plain_batch(payload: bytes | memoryview, max_messages: int, max_body: int, now_ms: int, /) -> PlainBatch | None:
        try:
            request = rpc.SendMessageRequest.FromString(bytes(payload))
        except DecodeError:
            return None
        msgs = request.messages
        if not 1 <= len(msgs) <= max_messages:
            return None
        topic = msgs[0].topic
        items: list[bytes] = []
        ids: list[str] = []
        body_bytes = 0
        for m in msgs:
            t = m.topic
            if not t.name or (t.resource_namespace, t.name) != (topic.resource_namespace, topic.name):
                return None
            body = m.body
            if m.user_properties or not 0 < len(body) <= max_body:
                return None
            try:
                props, mtype = to_properties(m, epoch_ms=now_ms)
            except MessageRefused:
                return None
            if mtype != pb.NORMAL:
                return None
            items.append(encode_batch_item(body, 0, encode_properties(props)))
            ids.append(props[PROPERTY_UNIQ_KEY])
            body_bytes += len(body)
        born = msgs[0].system_properties.born_timestamp
        born_ms = born.seconds * 1000 + born.nanos // 1_000_000 or now_ms
        return PlainBatch(topic.resource_namespace, topic.name, b"".join(items), ids, born_ms, body_bytes)

    @staticmethod
    def received_records(
        records: list[bytes | memoryview], topic: str, namespace: str, name: str, queue_id: int, seq: int,
        attempt: int, invisible_ms: int, system_names: frozenset[str], /,
    ) -> list[bytes | None]:  # fmt: skip
        """Records of ``topic`` handed out under one lease grant (``seq``, ``attempt``), each as the
        framed ReceiveMessageResponse that carries it; None for one that is not a sound record."""
        out: list[bytes | None] = []
        for record in records:
            try:
                rec = decode_record(record, check_crc=False)
            except RecordError:
                out.append(None)
                continue
            answer = rpc.ReceiveMessageResponse()
            res = pb.Resource(resource_namespace=namespace, name=name) if rec.topic == topic else None
            to_message(
                rec, handle=handle_of(queue_id, rec.queue_offset, seq), attempt=attempt, invisible_ms=invisible_ms,
                topic=res, into=answer.message,
            )  # fmt: skip
            out.append(framed(answer.SerializeToString()))
        return out

    @staticmethod
    def lease_scan(
        records: list[bytes | memoryview], topic: str, leases: dict[int, Any], done: set[int],
        tags: frozenset[str] | None, want: int, lease: Any, /,
    ) -> tuple[list[int], list[bytes | memoryview], list[int], int, int, int]:  # fmt: skip
        """A receive's new records of one queue, in offset order: each neither leased nor done is
        leased (``leases[offset] = lease``) and taken, or, when ``tags`` (None: every tag) does not
        hold its tag, marked done and listed as filtered; up to ``want`` taken. Stops at a record
        that is not a sound one of ``topic``, or whose properties are not ASCII or name one property
        twice (what the compiled one leaves to ``PopService._scan``'s own loop). ``(offsets taken,
        records taken, offsets filtered, records looked at, the queue offset after the last of them
        (-1: none), bodies' bytes)``."""
        offsets: list[int] = []
        taken: list[bytes | memoryview] = []
        filtered: list[int] = []
        looked, next_offset, body_bytes = 0, -1, 0
        for record in records:
            if len(offsets) >= want:
                break
            try:
                parsed = parse_record(record, check_crc=False)
            except RecordError:
                break
            raw = bytes(parsed.properties)
            if not raw.isascii():
                break
            properties = decode_properties(raw)
            if len(properties) != sum(1 for item in raw.split(b"\x02") if b"\x01" in item):
                break  # a name twice (a dict keeps one of them)
            o = parsed.header[5]  # (the queue offset)
            if parsed.topic != topic or not 0 <= o < 2**63 - 1:  # (an offset no queue has: a corrupt header)
                break
            if o not in leases and o not in done:
                if tags is None or properties.get(PROPERTY_TAGS) in tags:
                    leases[o] = lease
                    offsets.append(o)
                    taken.append(record)
                    body_bytes += parsed.header[14]  # (the body's length)
                else:
                    done.add(o)
                    filtered.append(o)
            looked += 1
            next_offset = o + 1
        return offsets, taken, filtered, looked, next_offset, body_bytes


PYTHON: V2Codec = PythonV2Codec()  # (mypy checks the twin against the Protocol)
COMPILED: V2Codec | None = v2_codec()
