"""Batched SendMessage on the broker's gRPC endpoint: plain messages of one topic are read from
the request's bytes into one batch (data_plane/proxy/v2_codec.py) and stored with one append;
what a consumer then receives is each message as it was sent — id, tag, keys, trace context,
born time, body — at the offsets the answer gave. A batch holding anything else (user
properties, a refused message) is judged message by message, as before."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.proxy.v2 import service_pb2 as rpc
from data_plane.proxy.v2 import service_pb2_grpc
from tests.integration.conftest import ServerProcess
from tests.integration.rocketmq5_endpoint import GRPC, Endpoint, names

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def _message(topic: str, i: int, **system: Any) -> pb.Message:
    m = pb.Message(topic=pb.Resource(name=topic), body=f"body-{i}".encode() * (i % 7 + 1))
    sp = m.system_properties
    sp.message_id = uuid.uuid4().hex.upper()
    sp.message_type = pb.NORMAL
    sp.born_timestamp.seconds, sp.born_timestamp.nanos = 1_700_000_000 + i, 250_000_000
    for k, v in system.items():
        if k == "keys":
            sp.keys.extend(v)
        else:
            setattr(sp, k, v)
    return m


async def _receive_all(stub: Any, topic: str, group: str, n: int) -> list[pb.Message]:
    req = rpc.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
        batch_size=32, invisible_duration=Duration(seconds=60), long_polling_timeout=Duration(seconds=1),
    )  # fmt: skip
    got: list[pb.Message] = []
    for _ in range(20):
        got += [r.message async for r in stub.ReceiveMessage(req, timeout=10) if r.HasField("message")]
        if len(got) >= n:
            break
    return got


async def test_a_batch_is_stored_in_one_queue_and_read_back_as_sent(
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    e = Endpoint(start_broker(namesrv.address, *GRPC), tmp_path / "home")
    topic, group = names()
    await e.topic(topic)
    await e.group(group)
    async with grpc.aio.insecure_channel(e.grpc) as channel:
        stub: Any = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        sent = [
            _message(topic, i, tag=f"t{i % 3}", keys=[f"k{i}", "order-7"], trace_context=f"00-{i:032x}-{i:016x}-01")
            for i in range(32)
        ]
        r = await stub.SendMessage(rpc.SendMessageRequest(messages=sent), timeout=10)
        assert r.status.code == pb.OK, r.status
        assert [x.message_id for x in r.entries] == [m.system_properties.message_id for m in sent]
        assert all(x.status.code == pb.OK for x in r.entries)
        offsets = [x.offset for x in r.entries]
        assert offsets == list(range(offsets[0], offsets[0] + 32)), "one batch: consecutive offsets of one queue"
        # A second batch, with a user property in one message: judged message by message, and
        # every message stored, its property with it.
        mixed = [_message(topic, 100 + i) for i in range(3)]
        mixed[1].user_properties["region"] = "eu"
        r2 = await stub.SendMessage(rpc.SendMessageRequest(messages=mixed), timeout=10)
        assert r2.status.code == pb.OK, r2.status
        # A batch with one refused message (a tag holding '|'): that one refused, the others stored.
        refused = [_message(topic, 200 + i) for i in range(3)]
        refused[2].system_properties.tag = "a|b"
        r3 = await stub.SendMessage(rpc.SendMessageRequest(messages=refused), timeout=10)
        assert r3.status.code == pb.MULTIPLE_RESULTS, r3.status
        assert [x.status.code for x in r3.entries] == [pb.OK, pb.OK, pb.ILLEGAL_MESSAGE_TAG]

        # A single plain message (a batch of one), with its own born time.
        single = _message(topic, 300, tag="solo", keys=["k-solo"])
        r4 = await stub.SendMessage(rpc.SendMessageRequest(messages=[single]), timeout=10)
        assert r4.status.code == pb.OK, r4.status
        assert [x.message_id for x in r4.entries] == [single.system_properties.message_id]

        got = await _receive_all(stub, topic, group, 32 + 3 + 2 + 1)
    by_id = {m.system_properties.message_id: m for m in got}
    assert len(got) == len(by_id) == 38
    for m, entry in zip(sent, r.entries, strict=True):
        back = by_id[m.system_properties.message_id]
        sp, bsp = m.system_properties, back.system_properties
        assert back.body == m.body
        assert (bsp.tag, list(bsp.keys), bsp.trace_context) == (sp.tag, list(sp.keys), sp.trace_context)
        assert bsp.born_timestamp.seconds == 1_700_000_000  # a batch's messages share its first one's born time
        assert (bsp.queue_offset, bsp.message_type) == (entry.offset, pb.NORMAL)
        assert not back.user_properties
    assert dict(by_id[mixed[1].system_properties.message_id].user_properties) == {"region": "eu"}
    assert refused[2].system_properties.message_id not in by_id
    solo = by_id[single.system_properties.message_id].system_properties
    assert (solo.tag, list(solo.keys), solo.born_timestamp.seconds) == ("solo", ["k-solo"], 1_700_000_300)
    assert solo.queue_offset == r4.entries[0].offset
