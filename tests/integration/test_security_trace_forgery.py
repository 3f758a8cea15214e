"""Security: a tenant must not be able to write events into another tenant's message trace.

CONSUMER_SEND_MSG_BACK records a "retried" / "dead_lettered" trace event whose ``topic`` was the
record's ``RETRY_TOPIC`` property — set by whoever sent the record. Before the fix, acme sent a
message to its own topic with ``RETRY_TOPIC=beta%orders`` and ``UNIQ_KEY`` = the unique key of one
of beta's messages, sent it back through its own group, and beta's QUERY_MESSAGE_TRACE of that
message then showed a forged "retried" event (with acme's group and address).
"""

from __future__ import annotations

import time

import orjson
import pytest

from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.store.message import decode_message_id, decode_properties, encode_properties
from sdk import protocol
from sdk.message import Message, new_unique_id
from tests.integration.tenancy_cluster import (
    TenancyCluster,
    tenancy_fixture,  # noqa: F401
    until,
)
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def send(topic: str, uniq: str, extra: dict[str, str] | None = None) -> RemotingCommand:
    cmd = protocol.send_request(
        group="DEFAULT_PRODUCER",
        msg=Message(topic, b"x"),
        queue_id=0,
        unique_id=uniq,
        born_timestamp_ms=int(time.time() * 1000),
    )
    if extra:
        ext = dict(cmd.ext_fields or {})
        ext["i"] = encode_properties({**decode_properties(ext.get("i", "")), **extra}).decode()
        cmd.ext_fields = ext
    return cmd


async def test_send_back_cannot_forge_events_in_another_tenants_trace(tenancy: TenancyCluster) -> None:
    await tenancy.stop_broker()
    await tenancy.start_broker("--set", "trace_enabled=true", "--set", "trace_flush_interval_ms=50")
    acme = await tenancy.new_tenant("acme")
    beta = await tenancy.new_tenant("beta")
    await tenancy.create_topic(acme, "orders")
    await tenancy.create_topic(beta, "orders")
    await tenancy.create_group(acme, "billing")

    victim_uniq = new_unique_id()
    resp = await tenancy.invoke(send("beta%orders", victim_uniq), token=beta.token)
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)

    # acme's own message, claiming beta's topic as its RETRY_TOPIC and beta's message's unique key.
    resp = await tenancy.invoke(send("acme%orders", victim_uniq, {"RETRY_TOPIC": "beta%orders"}), token=acme.token)
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    offset = decode_message_id((resp.ext_fields or {})["msgId"])[2]
    back = RemotingCommand(
        RequestCode.CONSUMER_SEND_MSG_BACK,
        ext_fields={"offset": str(offset), "group": "acme%billing", "delayLevel": "0", "originTopic": "acme%orders"},
    )
    resp = await tenancy.invoke(back, token=acme.token)
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)

    async def events(topic: str, token: str) -> list[dict[str, object]]:
        q = RemotingCommand(RequestCode.QUERY_MESSAGE_TRACE, ext_fields={"topic": topic, "msgId": victim_uniq})
        r = await tenancy.invoke(q, token=token)
        assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
        got: list[dict[str, object]] = orjson.loads(r.body_bytes())["events"]
        return got

    def forged(evs: list[dict[str, object]]) -> list[dict[str, object]]:
        return [e for e in evs if e.get("group") == "acme%billing" or e.get("event") == "retried"]

    # Wait until the retried event is recorded somewhere: in acme's trace (where it belongs) or
    # in beta's (the forgery).
    async def recorded() -> bool:
        acme_retried = any(e.get("event") == "retried" for e in await events("acme%orders", acme.token))
        return acme_retried or bool(forged(await events("beta%orders", beta.token)))

    await until(recorded, "the retried event")
    beta_events = await events("beta%orders", beta.token)
    assert forged(beta_events) == [], beta_events
    assert any(e.get("event") == "retried" for e in await events("acme%orders", acme.token))
