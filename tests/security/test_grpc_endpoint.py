"""Attacks on a broker's RocketMQ 5 gRPC endpoint (docs/rocketmq5.md), from outside, against a
real authenticating broker process and control plane:

* no credential, a forged signature, a stale signed time: nothing is served, not even a route or
  a Telemetry stream;
* a tenant's credential cannot reach another tenant's topic, by naming its namespace or its
  wire name;
* receipt handles cannot be forged or reused: a made-up handle, a real handle on another group,
  and a handle already acknowledged are all refused, and the message stays leased;
* what a peer sends is bounded: an oversized request is refused by the transport, a SendMessage
  with too many messages by the endpoint; garbage bytes on the port get nothing and the broker
  keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from data_plane.auth import v2_signature
from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.proxy.v2 import service_pb2 as rpc
from data_plane.proxy.v2 import service_pb2_grpc
from tests.integration.conftest import namesrv, processes, start_broker, start_namesrv  # noqa: F401
from tests.integration.tenancy_cluster import TenancyCluster, tenancy_fixture  # noqa: F401
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.asyncio]


def signed(ak: str, sk: str, namespace: str, *, when: float | None = None) -> tuple[tuple[str, str], ...]:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if when is None else when))
    auth = f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={v2_signature.sign(sk, stamp)}"
    return (("x-mq-date-time", stamp), ("authorization", auth), ("x-mq-namespace", namespace),
            ("x-mq-client-id", "attacker@1"))  # fmt: skip


def message(topic: str, body: bytes = b"x") -> pb.Message:
    m = pb.Message(topic=pb.Resource(name=topic), body=body)
    m.system_properties.message_id = uuid.uuid4().hex.upper()
    m.system_properties.message_type = pb.NORMAL
    return m


async def test_the_grpc_endpoint_refuses_what_an_attacker_tries(tenancy: TenancyCluster, tmp_path: Path) -> None:
    await tenancy.stop_broker()
    await tenancy.start_broker("--set", "grpc_listen=127.0.0.1:0")
    acme = await tenancy.new_tenant("acme")
    evil = await tenancy.new_tenant("evil")
    await tenancy.create_topic(acme, "orders")
    await tenancy.create_group(acme, "workers")
    await tenancy.create_group(acme, "others")
    await tenancy.create_topic(evil, "own")
    assert tenancy.broker is not None
    endpoint = tenancy.broker.info["grpc_address"]
    good = signed(acme.access_key, acme.secret, "acme")
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub: Any = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        route = rpc.QueryRouteRequest(topic=pb.Resource(name="orders"))
        # Who are you: nothing without a valid, fresh signature.
        for md in (
            (("x-mq-namespace", "acme"),),
            signed(acme.access_key, "guessed", "acme"),
            signed(acme.access_key, acme.secret, "acme", when=time.time() - 3600),
            signed("no-such-key", "x", "acme"),
        ):
            r = await stub.QueryRoute(route, metadata=md, timeout=10)
            assert r.status.code == pb.UNAUTHORIZED, (md, r.status)
        telemetry = stub.Telemetry(metadata=(("x-mq-namespace", "acme"),), timeout=10)
        with contextlib.suppress(grpc.aio.AioRpcError):  # (the endpoint may have ended the stream already)
            await telemetry.write(rpc.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER)))
        answers = [c async for c in telemetry]
        assert [c.status.code for c in answers] == [pb.UNAUTHORIZED]
        assert not any(c.HasField("settings") for c in answers)
        # What may you touch: evil's own credential, naming acme's namespace or its wire name.
        evil_md = signed(evil.access_key, evil.secret, "evil")
        as_acme = signed(evil.access_key, evil.secret, "acme")
        assert (await stub.QueryRoute(route, metadata=as_acme, timeout=10)).status.code == pb.FORBIDDEN
        sent = await stub.SendMessage(
            rpc.SendMessageRequest(messages=[message("orders")]), metadata=as_acme, timeout=10
        )
        assert sent.status.code == pb.FORBIDDEN
        wire = pb.Resource(resource_namespace="acme", name="orders")
        sneaky = rpc.SendMessageRequest(
            messages=[pb.Message(topic=wire, body=b"x", system_properties=message("x").system_properties)]
        )
        assert (await stub.SendMessage(sneaky, metadata=evil_md, timeout=10)).status.code == pb.FORBIDDEN
        # ... and as a batch of plain messages (read straight from the request's bytes): each refused.
        batch = [pb.Message(topic=wire, body=b"x", system_properties=message("x").system_properties) for _ in range(4)]
        refused = await stub.SendMessage(rpc.SendMessageRequest(messages=batch), metadata=evil_md, timeout=10)
        assert refused.status.code == pb.FORBIDDEN
        assert [e.status.code for e in refused.entries] == [pb.FORBIDDEN] * 4
        batch = [message("orders") for _ in range(4)]
        refused = await stub.SendMessage(rpc.SendMessageRequest(messages=batch), metadata=as_acme, timeout=10)
        assert refused.status.code == pb.FORBIDDEN
        # Handles: a real one, acknowledged once; then forged, reused, on another group.
        assert (
            await stub.SendMessage(rpc.SendMessageRequest(messages=[message("orders")]), metadata=good, timeout=10)
        ).status.code == pb.OK
        got = await receive(stub, good, "workers")
        assert len(got) == 1
        handle = got[0].system_properties.receipt_handle
        qid, offset, _seq = handle.split(":")
        for forged, grp in ((f"{qid}:{offset}:{'0' * 16}", "workers"), ("not-a-handle", "workers"), (handle, "others")):
            bad = await ack(stub, good, grp, forged)
            assert bad.status.code == pb.INVALID_RECEIPT_HANDLE, (forged, grp, bad.status)
        assert (await ack(stub, good, "workers", handle)).status.code == pb.OK
        assert (await ack(stub, good, "workers", handle)).status.code == pb.INVALID_RECEIPT_HANDLE  # used
        # Bounds: 65 messages in one call; a request past the transport's limit.
        many = rpc.SendMessageRequest(messages=[message("orders") for _ in range(65)])
        assert (await stub.SendMessage(many, metadata=good, timeout=10)).status.code == pb.BAD_REQUEST
        huge = rpc.SendMessageRequest(messages=[message("orders", b"x" * (20 << 20))])
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.SendMessage(huge, metadata=good, timeout=10)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Garbage on the port: answered with nothing useful, and the endpoint keeps serving.
    host, port = endpoint.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"\x00\x01\x02GET / HTTP/1.1\r\n\r\n" + b"\xff" * 4096)
    await writer.drain()
    junk = await asyncio.wait_for(reader.read(65536), 10)
    assert b"orders" not in junk
    writer.close()
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        assert (await stub.QueryRoute(route, metadata=good, timeout=10)).status.code == pb.OK


async def receive(stub: Any, md: Any, group: str) -> list[pb.Message]:
    req = rpc.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name="orders")),
        batch_size=8, invisible_duration=Duration(seconds=60), long_polling_timeout=Duration(seconds=5),
    )  # fmt: skip
    return [r.message async for r in stub.ReceiveMessage(req, metadata=md, timeout=15) if r.HasField("message")]


async def ack(stub: Any, md: Any, group: str, handle: str) -> Any:
    entry = rpc.AckMessageEntry(message_id="m", receipt_handle=handle)
    req = rpc.AckMessageRequest(group=pb.Resource(name=group), topic=pb.Resource(name="orders"), entries=[entry])
    return await stub.AckMessage(req, metadata=md, timeout=10)
