"""Retries and dead-letter queues with tenancy on (a real control plane, an authenticating
broker): a tenant's failed message goes through ``%RETRY%tenant%group`` to ``%DLQ%tenant%group``,
which the tenant reads with its own credentials; another tenant can neither read that DLQ nor
copy the tenant's message into its own retry topic by naming its CommitLog offset."""

from __future__ import annotations

import pytest

from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from sdk import AccessKeyCredentials, ConsumeResult, Message, MessageExt, Producer, PushConsumer
from sdk.admin import AdminClient, AdminError
from tests.integration.helpers import QUICK
from tests.integration.tenancy_cluster import (
    TenancyCluster,
    tenancy_fixture,  # noqa: F401
    until,
)
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_a_tenants_dead_letters_stay_in_its_namespace(tenancy: TenancyCluster) -> None:
    acme = await tenancy.new_tenant("acme")
    beta = await tenancy.new_tenant("beta")
    await tenancy.create_topic(acme, "orders")
    await tenancy.create_group(acme, "billing")
    await tenancy.create_topic(beta, "loot")  # a tenant's groups go to the brokers of its topics
    await tenancy.create_group(beta, "thief")
    ns = tenancy.namesrv.address
    acme_keys = AccessKeyCredentials(acme.access_key, acme.secret)
    beta_keys = AccessKeyCredentials(beta.access_key, beta.secret)

    async with Producer("acme%p", namesrv_addrs=ns, credentials=acme_keys) as producer:
        sent = await producer.send(Message("acme%orders", b"poison"))
    seen: list[tuple[str, int]] = []

    def fail(msgs: list[MessageExt]) -> ConsumeResult:
        seen.extend((m.topic, m.reconsume_times) for m in msgs)
        return ConsumeResult.RECONSUME_LATER

    c = PushConsumer(
        "acme%billing", namesrv_addrs=ns, credentials=acme_keys, instance_name="acme-c", max_reconsume_times=1,
        **QUICK,
    )  # fmt: skip
    c.subscribe("acme%orders")
    c.on_message(fail)
    await c.start()
    try:
        async with AdminClient([ns], credentials=acme_keys) as admin:
            # One retry, on the default ladder's first step (10 s), then the DLQ.
            await until(lambda: admin.dlq_messages("acme%billing"), "the message in acme's DLQ", timeout_s=30)
            (dead,) = await admin.dlq_messages("acme%billing")
    finally:
        await c.shutdown()
    assert seen == [("acme%orders", 0), ("acme%orders", 1)]
    assert dead.topic == "%DLQ%acme%billing"
    assert dead.properties["RETRY_TOPIC"] == "acme%orders"
    assert dead.properties["ORIGIN_MESSAGE_ID"] == sent.offset_msg_id
    topics = await tenancy.broker_topics()
    assert "%RETRY%acme%billing" in topics
    assert "%DLQ%acme%billing" in topics

    async with AdminClient([ns], credentials=beta_keys) as thief:
        with pytest.raises(AdminError, match=r"code 16: .*tenant 'acme'"):
            await thief.dlq_messages("acme%billing")
        # beta's own group, acme's message's offset: the broker refuses to copy it.
        steal = RemotingCommand(
            RequestCode.CONSUMER_SEND_MSG_BACK,
            ext_fields={"offset": str(dead.commit_log_offset), "group": "beta%thief", "delayLevel": "-1"},
        )
        answer = await thief._call(tenancy.broker_addr, steal)
    assert answer.code == ResponseCode.NO_PERMISSION, answer.remark
    assert "namespace" in (answer.remark or "")
