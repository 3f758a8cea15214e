"""A send of a tenant over its publish quota is refused off its frame: on a connection that has
authenticated as the tenant, a single send (SEND_MESSAGE_V2) to one of the tenant's topics
while its bucket is empty is answered FLOW_CONTROL, with its retry-after and the tenant's rate,
without being decoded, authenticated or stored. The early look grants nothing: whatever it does
not refuse takes the command path and its checks — another tenant's topic, a forged token."""

from __future__ import annotations

import asyncio
import struct
import time

import pytest

from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand, decode_frame, encode_bytes
from data_plane.tenancy.quota import parse_retry_after_ms
from sdk import protocol
from sdk.errors import FlowControlError
from sdk.message import Message, MessageQueue, new_unique_id
from tests.integration.tenancy_cluster import TenancyCluster, tenancy_fixture  # noqa: F401
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.asyncio]

LIMIT = 20  # msgs/s; a bucket holds one second's worth


def send(token: str, topic: str) -> bytes:
    cmd = protocol.send_request(
        group="acme%flood", msg=Message(topic, b"x" * 100), queue_id=0, unique_id=new_unique_id(),
        born_timestamp_ms=int(time.time() * 1000),
    )  # fmt: skip
    cmd.ext_fields = {**(cmd.ext_fields or {}), "Authorization": f"Bearer {token}"}
    return encode_bytes(cmd)


async def answer(reader: asyncio.StreamReader) -> RemotingCommand:
    (length,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), 10))
    return decode_frame(await asyncio.wait_for(reader.readexactly(length), 10))


async def queue_size(tenancy: TenancyCluster, topic: str) -> int:
    """Messages stored in queue 0 of ``topic`` (every send here goes to queue 0)."""
    mq = MessageQueue(topic, "broker-a", 0)
    resp = await tenancy.invoke(
        protocol.queue_offset_request(RequestCode.GET_MAX_OFFSET, mq), token=tenancy.cp.operator_token
    )
    return protocol.parse_offset_response(resp)


async def refusal_counts(tenancy: TenancyCluster) -> tuple[int, int]:
    """The broker's publishes refused for a quota so far: (off their frames, on the command path)."""
    table = (await tenancy.operator_json(RequestCode.GET_BROKER_RUNTIME_INFO))["table"]
    return int(table["quotaEarlyRefusals"]), int(table["quotaRefusals"])


async def test_sends_over_the_quota_are_refused_off_their_frames_and_nothing_else_is(tenancy: TenancyCluster) -> None:
    acme = await tenancy.new_tenant("acme")
    beta = await tenancy.new_tenant("beta")
    reply = await tenancy.cp.call("PUT", "/v1/tenants/acme/quota", operator=True, json={"publish_msgs_per_s": LIMIT})
    assert reply.status == 200, reply.body
    await tenancy.create_topic(acme, "orders")
    await tenancy.create_topic(beta, "orders")
    await tenancy.reconciled(rounds=1)
    early_before, command_before = await refusal_counts(tenancy)
    assert tenancy.broker is not None
    host, _, port = tenancy.broker.address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        codes = []
        for _ in range(LIMIT + 10):  # one at a time: the bucket's worth, then refusals
            writer.write(send(acme.token, "acme%orders"))
            codes.append((await answer(reader)).code)
        assert codes.count(ResponseCode.SUCCESS) >= LIMIT
        assert ResponseCode.FLOW_CONTROL in codes
        writer.write(send(acme.token, "acme%orders"))
        refused = await answer(reader)
        assert refused.code == ResponseCode.FLOW_CONTROL
        assert parse_retry_after_ms(refused.remark) is not None
        assert FlowControlError(remark=refused.remark or "").quota_msgs_per_s == LIMIT  # the rate the SDK paces to
        early, command = await refusal_counts(tenancy)
        assert early > early_before  # answered off the frame, not the command path
        # Every refusal is counted, on one path or the other (runtime info: what the load test reads).
        assert (early - early_before) + (command - command_before) == codes.count(ResponseCode.FLOW_CONTROL) + 1
        # Over the quota still: another tenant's topic on this connection is not refused for
        # acme's quota — it meets the command path, whose authorization refuses it.
        writer.write(send(acme.token, "beta%orders"))
        other = await answer(reader)
        assert other.code == ResponseCode.NO_PERMISSION, other.remark
    finally:
        writer.close()
    # A forged token on a fresh connection is never looked at early: no tenant is known for it.
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(send("not-a-token", "acme%orders"))
        forged = await answer(reader)
        assert forged.code not in (ResponseCode.SUCCESS, ResponseCode.FLOW_CONTROL), forged.remark
    finally:
        writer.close()
    # Nothing refused was stored: beta's topic holds nothing, acme's what SUCCESS answered.
    assert await queue_size(tenancy, "beta%orders") == 0
    assert await queue_size(tenancy, "acme%orders") == codes.count(ResponseCode.SUCCESS)
