"""A tenant over its publish quota is throttled, not churned: once the broker answers a
connection FLOW_CONTROL it stops reading that connection until the answer's retry-after, so what
a flooding client sends meanwhile waits in the socket buffers instead of being read, decoded,
authorized and refused on the broker's event loop (the model of Kafka's quota throttling)."""

from __future__ import annotations

import asyncio
import struct
import time

import pytest

from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand, decode_frame, encode_bytes
from data_plane.tenancy.quota import parse_retry_after_ms
from sdk import protocol
from sdk.message import Message, new_unique_ids
from tests.integration.tenancy_cluster import TenancyCluster, tenancy_fixture  # noqa: F401
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.asyncio]

LIMIT = 40  # msgs/s: a batch of LIMIT messages empties the bucket, the next waits about a second


def batch(token: str, n: int) -> bytes:
    cmd = protocol.send_batch_request(
        group="acme%flood", msgs=[Message("acme%orders", b"x" * 100) for _ in range(n)], queue_id=0,
        unique_ids=new_unique_ids(n), born_timestamp_ms=int(time.time() * 1000),
    )  # fmt: skip
    cmd.ext_fields = {**(cmd.ext_fields or {}), "Authorization": f"Bearer {token}"}
    return encode_bytes(cmd)


async def read_answer(reader: asyncio.StreamReader, timeout_s: float = 10) -> RemotingCommand:
    (length,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), timeout_s))
    return decode_frame(await asyncio.wait_for(reader.readexactly(length), timeout_s))


async def test_a_connection_answered_flow_control_is_not_read_until_its_retry_after(tenancy: TenancyCluster) -> None:
    await tenancy.stop_broker()
    await tenancy.start_broker("--set", "quota_throttle_max_ms=1000")
    acme = await tenancy.new_tenant("acme")
    reply = await tenancy.cp.call("PUT", "/v1/tenants/acme/quota", operator=True, json={"publish_msgs_per_s": LIMIT})
    assert reply.status == 200, reply.body
    await tenancy.create_topic(acme, "orders")
    await tenancy.reconciled(rounds=1)
    before = int((await tenancy.operator_json(RequestCode.GET_BROKER_RUNTIME_INFO))["table"].get("quotaThrottles", 0))
    assert tenancy.broker is not None
    host, _, port = tenancy.broker.address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        # The bucket's worth, then one more batch: stored, then refused with a retry-after.
        writer.write(batch(acme.token, LIMIT))
        assert (await read_answer(reader)).code == ResponseCode.SUCCESS
        writer.write(batch(acme.token, LIMIT))
        refused = await read_answer(reader)
        assert refused.code == ResponseCode.FLOW_CONTROL, refused.remark
        retry_after_ms = parse_retry_after_ms(refused.remark)
        assert retry_after_ms is not None
        assert retry_after_ms >= 500
        refused_at = time.monotonic()
        # The flood goes on at once: nothing of it is read until the retry-after has passed.
        for _ in range(20):
            writer.write(batch(acme.token, LIMIT))
        await writer.drain()
        first = await read_answer(reader)
        waited_ms = (time.monotonic() - refused_at) * 1000
        # (the broker pauses for the retry-after, at most quota_throttle_max_ms = 1000 ms)
        assert waited_ms >= min(retry_after_ms, 1000) * 0.8, (waited_ms, retry_after_ms)
        assert first.code in (ResponseCode.SUCCESS, ResponseCode.FLOW_CONTROL)
    finally:
        writer.close()
    after = int((await tenancy.operator_json(RequestCode.GET_BROKER_RUNTIME_INFO))["table"]["quotaThrottles"])
    assert after > before
