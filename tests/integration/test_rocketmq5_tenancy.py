"""RocketMQ 5 clients with tenancy on: the official Python client signs with a tenant's access
key (MQv2-HMAC-SHA1) and names the tenant as its namespace, so it uses plain topic and group
names; a wrong secret or another tenant's namespace is refused; a Bearer token from the control
plane works too."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.proxy.v2 import service_pb2 as rpc
from data_plane.proxy.v2 import service_pb2_grpc
from tests import rocketmq5_client as v5
from tests.integration.tenancy_cluster import TenancyCluster, tenancy_fixture, until  # noqa: F401
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def query_route(endpoint: str, topic: str, namespace: str, authorization: str) -> pb.Status:
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        md = (("x-mq-namespace", namespace), ("authorization", authorization))
        r: rpc.QueryRouteResponse = await stub.QueryRoute(
            rpc.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=md, timeout=10
        )
        return r.status


async def test_v5_clients_authenticate_as_their_tenant_and_stay_in_its_namespace(
    tenancy: TenancyCluster, tmp_path: Path
) -> None:
    v5.client_python()
    await tenancy.stop_broker()
    await tenancy.start_broker("--set", "grpc_listen=127.0.0.1:0")
    acme = await tenancy.new_tenant("acme")
    beta = await tenancy.new_tenant("beta")
    await tenancy.create_topic(acme, "orders")
    await tenancy.create_group(acme, "workers")
    await tenancy.create_topic(beta, "own")  # (a broker knows the credentials of tenants it serves)
    assert tenancy.broker is not None
    endpoint = tenancy.broker.info["grpc_address"]
    home = tmp_path / "client-home"
    acme_client = {"endpoint": endpoint, "ak": acme.access_key, "sk": acme.secret, "namespace": "acme"}

    def run(role: str, **args: Any) -> dict[str, Any]:
        return v5.run(role, {**acme_client, **args}, home=home)

    sent = await asyncio.to_thread(run, "produce", topic="orders", messages=[{"body": f"m{i}"} for i in range(3)])
    assert len(sent["sent"]) == 3
    got = await asyncio.to_thread(run, "simple", topic="orders", group="workers", count=3, timeout_s=20)
    assert sorted(m["body"] for m in got["received"]) == ["m0", "m1", "m2"]
    assert got["errors"] == []

    # A wrong secret: the signature does not verify.
    bad = await asyncio.to_thread(run, "error", sk="not-the-secret", topic="orders", call="send")
    assert "route" in (bad["error"] or ""), bad  # the client says only that much
    assert "signature does not match" in tenancy.broker.log_text()  # the broker logs why
    # Beta's own credential, naming acme's namespace: refused before anything is read.
    other = await asyncio.to_thread(
        run, "error", ak=beta.access_key, sk=beta.secret, topic="orders", group="workers", call="receive"
    )
    assert "route" in (other["error"] or ""), other
    assert "namespace 'acme' is not the credential's tenant's" in tenancy.broker.log_text()
    assert (await query_route(endpoint, "orders", "acme", f"Bearer {beta.token}")).code == pb.FORBIDDEN
    # Beta in its own namespace finds no topic of acme's there.
    beta_route = await query_route(endpoint, "orders", "beta", f"Bearer {beta.token}")
    assert beta_route.code == pb.TOPIC_NOT_FOUND
    # The Node.js client signs the same way: its access key works, a wrong secret does not.
    node_sent = await asyncio.to_thread(
        v5.run_node, "produce", {**acme_client, "topic": "orders", "messages": [{"body": "from-node"}]}, home=home
    )
    assert len(node_sent["sent"]) == 1
    node_bad = await asyncio.to_thread(
        v5.run_node, "error", {**acme_client, "sk": "wrong", "topic": "orders", "call": "send"}, home=home
    )
    assert node_bad["error"] is not None
    # A Bearer token from the control plane is accepted as the access key's signature is.
    assert (await query_route(endpoint, "orders", "acme", f"Bearer {acme.token}")).code == pb.OK
    assert (await query_route(endpoint, "orders", "acme", "Bearer not-a-token")).code == pb.UNAUTHORIZED
    assert (await query_route(endpoint, "orders", "acme", "")).code == pb.UNAUTHORIZED
    # What the endpoint does not serve is answered UNSUPPORTED, to an authenticated caller only.
    for authorization, code in ((f"Bearer {acme.token}", pb.UNSUPPORTED), ("", pb.UNAUTHORIZED)):
        async with grpc.aio.insecure_channel(endpoint) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
            md = (("x-mq-namespace", "acme"), ("authorization", authorization))
            r: rpc.GetOffsetResponse = await stub.GetOffset(rpc.GetOffsetRequest(), metadata=md, timeout=10)
            assert r.status.code == code, r.status


async def test_v5_calls_are_held_to_the_tenants_quota_and_metered(tenancy: TenancyCluster, tmp_path: Path) -> None:
    """A publish quota of 20 msgs/s: a burst of 100 gRPC sends is partly answered
    TOO_MANY_REQUESTS, saying so; what was sent and received is in the tenant's usage, bytes in
    exactly the bodies that were stored."""
    from google.protobuf.duration_pb2 import Duration

    from data_plane.auth import v2_signature

    await tenancy.stop_broker()
    await tenancy.start_broker("--set", "grpc_listen=127.0.0.1:0")
    acme = await tenancy.new_tenant("acme")
    reply = await tenancy.cp.call("PUT", "/v1/tenants/acme/quota", operator=True, json={"publish_msgs_per_s": 20})
    assert reply.status == 200, reply.body
    await tenancy.create_topic(acme, "orders")
    await tenancy.create_group(acme, "workers")
    assert tenancy.broker is not None
    endpoint = tenancy.broker.info["grpc_address"]

    def md() -> tuple[tuple[str, str], ...]:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        sig = v2_signature.sign(acme.secret, stamp)
        auth = f"MQv2-HMAC-SHA1 Credential={acme.access_key}, SignedHeaders=x-mq-date-time, Signature={sig}"
        return (("x-mq-date-time", stamp), ("authorization", auth), ("x-mq-namespace", "acme"))

    body = b"q" * 100
    ok = throttled = 0
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        for i in range(100):
            m = pb.Message(topic=pb.Resource(name="orders"), body=body)
            m.system_properties.message_id = f"Q{i:031d}"
            r: rpc.SendMessageResponse = await stub.SendMessage(rpc.SendMessageRequest(messages=[m]), metadata=md())
            if r.status.code == pb.OK:
                ok += 1
            else:
                assert r.status.code == pb.TOO_MANY_REQUESTS, r.status
                assert "publish quota" in r.status.message, r.status
                throttled += 1
        assert min(ok, throttled) > 0, (ok, throttled)
        # A batch of plain messages is held to the same quota (and metered the same way).
        batch = [pb.Message(topic=pb.Resource(name="orders"), body=body) for _ in range(2)]
        for i, m in enumerate(batch):
            m.system_properties.message_id = f"B{i:031d}"
        r = await stub.SendMessage(rpc.SendMessageRequest(messages=batch), metadata=md())
        if r.status.code == pb.OK:
            ok += 2
        else:
            assert r.status.code == pb.TOO_MANY_REQUESTS, r.status
            assert [e.status.code for e in r.entries] == [pb.TOO_MANY_REQUESTS] * 2
        req = rpc.ReceiveMessageRequest(
            group=pb.Resource(name="workers"), message_queue=pb.MessageQueue(topic=pb.Resource(name="orders")),
            batch_size=64, invisible_duration=Duration(seconds=60), long_polling_timeout=Duration(seconds=1),
        )  # fmt: skip
        received = 0
        for _ in range(10):
            got = [x async for x in stub.ReceiveMessage(req, metadata=md(), timeout=10) if x.HasField("message")]
            received += len(got)
            if received >= ok:
                break
        assert received == ok

    async def metered() -> bool:
        got = await tenancy.cp.call("GET", "/v1/tenants/acme/usage?granularity=minute", token=acme.token)
        totals = got.body.get("totals", {}) if got.status == 200 else {}
        # bytes in: the stored bodies and the refused ones (read before the quota said no), as on
        # the remoting path; bytes out: the bodies handed out
        return int(totals.get("bytes_in", 0)) == 102 * len(body) and int(totals.get("bytes_out", 0)) == ok * len(body)

    await until(metered, "the gRPC traffic in acme's usage", timeout_s=20)
