"""Security: CONSUMER_SEND_MSG_BACK (36) copies only what the sender's grants let it read.

A send-back names a record by its CommitLog offset and the broker copies that record into the
group's ``%RETRY%`` (or ``%DLQ%``) topic, which the group's subscribe reads. The attack: a
credential of tenant ``alpha`` granted only topic ``orders`` and group ``g1`` is refused on
``alpha%secret``, sends back a record of ``alpha%secret`` by its offset (no ``originTopic``, or
a lying one) and reads it from ``%RETRY%alpha%g1`` / ``%DLQ%alpha%g1``. The broker must judge the
record at the offset, not the header: its topic (for a retry or DLQ record, its ``RETRY_TOPIC``
too) must be one the credential may subscribe to, in the group's tenant, and a given
``originTopic`` must be the record's. Every refusal is NO_PERMISSION, one log line with the
source address (no token, no secret), and counted (``authDenied`` in the runtime info).

Everything runs in real processes: the control plane (with its reconciler), a name server and
an authenticating broker on 127.0.0.1; requests are raw RemotingCommands on the wire.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.store.message import decode_message_id, decode_properties, encode_properties
from sdk import protocol
from sdk.message import Message, MessageExt, MessageQueue, new_unique_id
from tests.integration.conftest import namesrv, processes, start_broker, start_namesrv  # noqa: F401
from tests.integration.tenancy_cluster import (
    GROUP,
    TenancyCluster,
    Tenant,
    tenancy_fixture,  # noqa: F401
    until,
)
from tests.integration.test_tenancy_e2e_refusals import pull_cmd
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.asyncio]

ORDERS, SECRET, G1 = "alpha%orders", "alpha%secret", "alpha%g1"
RETRY, DLQ = "%RETRY%alpha%g1", "%DLQ%alpha%g1"
# What the attacker's credential was granted: topic orders and group g1, nothing else.
LIMITED_GRANTS = [
    {"resource": "topic", "pattern": "orders", "actions": ["publish", "subscribe"]},
    {"resource": "group", "pattern": "g1", "actions": ["subscribe"]},
]
REFUSAL_LOG = "refused request code 36 from 127.0.0.1:"


async def alpha_and_a_limited_credential(tenancy: TenancyCluster) -> tuple[Tenant, str, str]:
    """Tenant alpha (topics orders and secret, group g1), its full credential, and the token
    and secret of a credential granted only ``LIMITED_GRANTS``."""
    alpha = await tenancy.new_tenant("alpha")
    await tenancy.create_topic(alpha, "orders")
    await tenancy.create_topic(alpha, "secret")
    await tenancy.create_group(alpha, "g1")
    made = await tenancy.cp.call(
        "POST", "/v1/tenants/alpha/credentials", token=alpha.token, json={"grants": LIMITED_GRANTS}
    )
    assert made.status == 201, made.body
    assert made.body["grants"] == LIMITED_GRANTS
    token = await tenancy.cp.token_for(made.body["access_key"], made.body["secret"])
    await tenancy.reconciled(rounds=1)  # the credential's snapshot reaches the broker
    return alpha, token, str(made.body["secret"])


async def send(tenancy: TenancyCluster, topic: str, body: bytes, token: str, **props: str) -> int:
    """One message to queue 0 of ``topic``; its CommitLog offset."""
    cmd = protocol.send_request(
        group="DEFAULT_PRODUCER",
        msg=Message(topic, body),
        queue_id=0,
        unique_id=new_unique_id(),
        born_timestamp_ms=int(time.time() * 1000),
    )
    if props:
        ext = dict(cmd.ext_fields or {})
        ext["i"] = encode_properties({**decode_properties(ext.get("i", "")), **props}).decode()
        cmd.ext_fields = ext
    resp = await tenancy.invoke(cmd, token=token)
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    offset: int = decode_message_id((resp.ext_fields or {})["msgId"])[2]
    return offset


def send_back(offset: int, *, origin: str | None = None, delay_level: int = 0, group: str = G1) -> RemotingCommand:
    ext = {"offset": str(offset), "group": group, "delayLevel": str(delay_level), "maxReconsumeTimes": "16"}
    if origin is not None:
        ext["originTopic"] = origin
    return RemotingCommand(RequestCode.CONSUMER_SEND_MSG_BACK, ext_fields=ext)


async def refused(tenancy: TenancyCluster, cmd: RemotingCommand, token: str) -> str:
    resp = await tenancy.invoke(cmd, token=token)
    assert resp.code == ResponseCode.NO_PERMISSION, (resp.code, resp.remark)
    return resp.remark or ""


async def accepted(tenancy: TenancyCluster, cmd: RemotingCommand, token: str) -> None:
    resp = await tenancy.invoke(cmd, token=token)
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)


async def pull(tenancy: TenancyCluster, topic: str, token: str) -> list[MessageExt]:
    """Everything in queue 0 of ``topic``, read as group g1."""
    resp = await tenancy.invoke(pull_cmd(topic, G1), token=token)
    assert resp.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND), (resp.code, resp.remark)
    return protocol.parse_pull_response(resp, GROUP).messages


async def runtime(tenancy: TenancyCluster) -> dict[str, Any]:
    table: dict[str, Any] = (await tenancy.operator_json(RequestCode.GET_BROKER_RUNTIME_INFO))["table"]
    return table


def refusal_lines(tenancy: TenancyCluster) -> list[str]:
    assert tenancy.broker is not None
    return [line for line in tenancy.broker.log_text().splitlines() if REFUSAL_LOG in line]


def assert_logged_without_secrets(tenancy: TenancyCluster, lines: list[str], *secrets: str) -> None:
    assert tenancy.broker is not None
    text = tenancy.broker.log_text()
    for s in secrets:
        assert s not in text
    for line in lines:
        assert "send-back to group 'alpha%g1'" in line, line


async def test_a_grant_on_orders_cannot_send_back_a_record_of_another_topic(tenancy: TenancyCluster) -> None:
    alpha, limited, limited_secret = await alpha_and_a_limited_credential(tenancy)
    secret_offset = await send(tenancy, SECRET, b"the secret", alpha.token)
    # The premise: the limited credential may not read alpha%secret.
    pull_secret = protocol.pull_request(
        group=G1, mq=MessageQueue(SECRET, GROUP, 0), offset=0, max_nums=32, subscription="*", sub_version=0,
        suspend_timeout_ms=0, suspend=False,
    )  # fmt: skip
    assert "may not subscribe topic 'secret'" in await refused(tenancy, pull_secret, limited)

    before = await runtime(tenancy)
    topics = await tenancy.broker_topics()
    assert not {RETRY, DLQ} & topics.keys(), sorted(topics)
    # By offset alone, with a lying originTopic (one it may read), to the retry topic and to the DLQ.
    remarks = [
        await refused(tenancy, send_back(secret_offset), limited),
        await refused(tenancy, send_back(secret_offset, origin=ORDERS), limited),
        await refused(tenancy, send_back(secret_offset, delay_level=-1), limited),
        await refused(tenancy, send_back(secret_offset, origin=ORDERS, delay_level=-1), limited),
    ]
    assert ["may not subscribe" in r for r in remarks] == [True, False, True, False], remarks
    assert all("originTopic 'alpha%orders' is not the topic" in r for r in remarks[1::2]), remarks
    assert all("secret" not in r for r in remarks), remarks  # the remark does not name the record's topic

    # Nothing landed: no retry or DLQ topic was made, not one byte was written to the CommitLog
    # (a retry copy would wait in the schedule topic first), and the full credential reads nothing.
    after = await runtime(tenancy)
    assert after["commitLogMaxOffset"] == before["commitLogMaxOffset"]
    topics = await tenancy.broker_topics()
    assert not {RETRY, DLQ} & topics.keys(), sorted(topics)
    # Each refusal: counted, and one log line naming the source address, without token or secret.
    assert int(after["authDenied"]) - int(before["authDenied"]) == 4
    await until(lambda: len(refusal_lines(tenancy)) == 4, "four refusals in the broker's log")
    assert_logged_without_secrets(tenancy, refusal_lines(tenancy), limited, limited_secret, alpha.secret)


async def test_the_credentials_own_send_back_still_works_and_is_redelivered(tenancy: TenancyCluster) -> None:
    alpha, limited, _ = await alpha_and_a_limited_credential(tenancy)
    order_offset = await send(tenancy, ORDERS, b"an order", limited)

    # Its own record, named as the SDK names it (originTopic = the topic it pulled): on the retry
    # topic after the ladder's first level (1 s), where the credential reads it.
    await accepted(tenancy, send_back(order_offset, origin=ORDERS, delay_level=1), limited)

    async def redelivered() -> list[MessageExt]:
        return await pull(tenancy, RETRY, limited) if RETRY in await tenancy.broker_topics() else []

    await until(redelivered, "the order redelivered on the retry topic")
    (retried,) = await redelivered()
    assert (retried.body, retried.reconsume_times, retried.properties["RETRY_TOPIC"]) == (b"an order", 1, ORDERS)

    # The retry copy sent back again (its origin is RETRY_TOPIC = orders), straight to the DLQ.
    await accepted(tenancy, send_back(retried.commit_log_offset, origin=ORDERS, delay_level=-1), limited)
    (dead,) = await pull(tenancy, DLQ, limited)
    assert (dead.body, dead.reconsume_times, dead.properties["RETRY_TOPIC"]) == (b"an order", 2, ORDERS)

    # A record on the group's retry topic that claims alpha%secret as its origin (the group's
    # subscribe may send there): its origin decides, so it is refused, with or without an
    # originTopic, and with one naming the retry topic itself.
    before = await runtime(tenancy)
    forged = await send(tenancy, RETRY, b"claims secret", limited, RETRY_TOPIC=SECRET)
    for origin in (None, RETRY, ORDERS):
        await refused(tenancy, send_back(forged, origin=origin, delay_level=-1), limited)
    assert [m.body for m in await pull(tenancy, DLQ, limited)] == [b"an order"]
    after = await runtime(tenancy)
    assert int(after["authDenied"]) - int(before["authDenied"]) == 3
    # The full credential may: the same record then goes through.
    await accepted(tenancy, send_back(forged, delay_level=-1), alpha.token)
    assert [m.body for m in await pull(tenancy, DLQ, alpha.token)] == [b"an order", b"claims secret"]


async def test_another_tenants_record_offset_is_refused(tenancy: TenancyCluster) -> None:
    alpha, limited, limited_secret = await alpha_and_a_limited_credential(tenancy)
    beta = await tenancy.new_tenant("beta")
    await tenancy.create_topic(beta, "orders")
    theirs = await send(tenancy, "beta%orders", b"beta's order", beta.token)

    before = await runtime(tenancy)
    remarks = []
    for token in (limited, alpha.token):  # neither a narrow nor a full grant of alpha reaches beta
        for origin in (None, ORDERS):
            remarks.append(await refused(tenancy, send_back(theirs, origin=origin), token))
            remarks.append(await refused(tenancy, send_back(theirs, origin=origin, delay_level=-1), token))
    assert all("namespace" in r and "beta" not in r for r in remarks), remarks
    after = await runtime(tenancy)
    assert after["commitLogMaxOffset"] == before["commitLogMaxOffset"]
    topics = await tenancy.broker_topics()
    assert not {RETRY, DLQ} & topics.keys(), sorted(topics)
    assert int(after["authDenied"]) - int(before["authDenied"]) == len(remarks)
    await until(lambda: len(refusal_lines(tenancy)) == len(remarks), "every refusal in the broker's log")
    lines = refusal_lines(tenancy)
    assert all("outside the group's namespace" in line for line in lines), lines
    assert_logged_without_secrets(tenancy, lines, limited, limited_secret, alpha.token, alpha.secret, beta.secret)
