"""The gRPC endpoint's two hottest conversions, straight between protobuf's wire format and the
store's: a SendMessageRequest of plain messages of one topic read into the body of one
SEND_BATCH_MESSAGE (layout in ``data_plane/remoting/bodies.py``), and a stored message written
as the framed ReceiveMessageResponse that hands it out under a lease.

Two implementations satisfy ``data_plane.store.compiled.V2Codec``: the compiled
``_v2_codec.c``, which does both without a protobuf object or a properties dict per message,
and ``PythonV2Codec`` here, the reference: the request parsed and each message through
``messages.to_properties`` and ``encode_batch_item``, as ``service.MessagingService`` stores a
batch; the answer built by ``messages.to_message`` and serialized. The endpoint takes the
compiled one when it is built; without it, the service's own path serves, which this twin
restates. The compiled one answers None for what it leaves to that path.

"Plain" is what the batch path stores without a question: NORMAL messages of one
topic (a single one too, stored as a batch of one: the record the single path writes), none
with user properties, a message group or a delivery time, each one the v5 rules accept.
Anything else is None, and the service parses the request and judges each message.
"""

from __future__ import annotations

from typing import NamedTuple

from google.protobuf.message import DecodeError

from data_plane.http2.grpc_server import framed
from data_plane.proxy.messages import MessageRefused, to_message, to_properties
from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.proxy.v2 import service_pb2 as rpc
from data_plane.remoting.bodies import encode_batch_item
from data_plane.store.compiled import V2Codec, v2_codec
from data_plane.store.message import PROPERTY_UNIQ_KEY, StoredMessage, encode_properties


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
    def received_message(
        rec: StoredMessage, message_id: str, digest: str, namespace: str, name: str, handle: str, attempt: int,
        invisible_ms: int, system_names: frozenset[str], /,
    ) -> bytes | None:  # fmt: skip
        """``rec`` handed out under a lease, as the framed ReceiveMessageResponse that carries it
        (``message_id`` and ``digest`` as the caller worked them out: what ``to_message`` would)."""
        answer = rpc.ReceiveMessageResponse()
        topic = pb.Resource(resource_namespace=namespace, name=name)
        to_message(rec, handle=handle, attempt=attempt, invisible_ms=invisible_ms, topic=topic, into=answer.message)
        sp = answer.message.system_properties
        sp.message_id, sp.body_digest.checksum = message_id, digest
        return framed(answer.SerializeToString())


PYTHON: V2Codec = PythonV2Codec()  # (mypy checks the twin against the Protocol)
COMPILED: V2Codec | None = v2_codec()
