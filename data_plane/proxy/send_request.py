"""A SendMessageRequest of plain messages of one topic, read into the body of one
SEND_BATCH_MESSAGE (layout in ``data_plane/remoting/bodies.py``) and what the answer needs.

Two implementations satisfy ``data_plane.store.compiled.SendRequestCodec``: the compiled
``_send_request.c``, which reads the request's protobuf wire bytes and builds the body without a
protobuf object or a properties dict per message, and ``PythonSendRequest`` here, the reference:
the request parsed, each message through ``messages.to_properties`` and ``encode_batch_item``,
as ``service.MessagingService`` stores a batch. The endpoint takes the compiled one when it is
built; without it, every request takes the service's own path, which this twin restates.

"Plain" is what the batch path stores without a question: two or more NORMAL messages of one
topic, none with user properties, a message group or a delivery time, each one the v5 rules
accept. Anything else is None, and the service parses the request and judges each message.
"""

from __future__ import annotations

from typing import NamedTuple

from google.protobuf.message import DecodeError

from data_plane.proxy.messages import MessageRefused, to_properties
from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.proxy.v2 import service_pb2 as rpc
from data_plane.remoting.bodies import encode_batch_item
from data_plane.store.compiled import SendRequestCodec, send_request
from data_plane.store.message import PROPERTY_UNIQ_KEY, encode_properties


class PlainBatch(NamedTuple):
    namespace: str  # the topic's resource_namespace, as the messages give it
    name: str
    items: bytes  # a SEND_BATCH_MESSAGE body: one item per message, in order
    message_ids: list[str]
    born_ms: int  # the first message's born time (the batch's), or the time given when it has none
    body_bytes: int  # the bodies' bytes, for metering


class PythonSendRequest:
    """The pure-Python ``SendRequestCodec``."""

    @staticmethod
    def plain_batch(payload: bytes | memoryview, max_messages: int, max_body: int, now_ms: int, /) -> PlainBatch | None:
        try:
            request = rpc.SendMessageRequest.FromString(bytes(payload))
        except DecodeError:
            return None
        msgs = request.messages
        if not 2 <= len(msgs) <= max_messages:
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


PYTHON: SendRequestCodec = PythonSendRequest()  # (mypy checks the twin against the Protocol)
COMPILED: SendRequestCodec | None = send_request()
