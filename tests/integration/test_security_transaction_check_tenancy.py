"""Security: a tenant must not be able to make the broker send CHECK_TRANSACTION_STATE (with its
message) to another tenant's producers.

The check service sends a half message's check to a producer connection of the half's producer
group, which is the message's ``PGROUP`` property or else the send header's producer group — both
chosen by the sender. Before the fix, acme could send a transactional message to its own topic with
``PGROUP=beta%tx`` (or header producerGroup ``beta%tx``, or an unprefixed shared group such as
``DEFAULT_PRODUCER``) and the broker delivered acme's message to beta's producer as a check request.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from data_plane.remoting import bodies
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.connection import Connection
from data_plane.store.message import decode_properties, encode_properties
from sdk import protocol
from sdk.message import Message, new_unique_id
from tests.integration.tenancy_cluster import (
    TenancyCluster,
    tenancy_fixture,  # noqa: F401
    until,
)
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def tx_send(topic: str, header_group: str, pgroup: str | None, body: bytes) -> RemotingCommand:
    cmd = protocol.send_request(
        group=header_group,
        msg=Message(topic, body),
        queue_id=0,
        unique_id=new_unique_id(),
        born_timestamp_ms=int(time.time() * 1000),
    )
    ext = dict(cmd.ext_fields or {})
    props = decode_properties(ext.get("i", ""))
    props["TRAN_MSG"] = "true"
    if pgroup is not None:
        props["PGROUP"] = pgroup
    ext["i"] = encode_properties(props).decode()
    cmd.ext_fields = ext
    return cmd


class Producer:
    """A raw client that registers as a producer group and records the checks it is sent."""

    def __init__(self, cluster: TenancyCluster, token: str, group: str, client_id: str) -> None:
        self.cluster, self.token, self.group, self.client_id = cluster, token, group, client_id
        self.checks: list[RemotingCommand] = []
        self.client = RemotingClient(self._dispatch)

    def _dispatch(self, conn: Connection, cmd: RemotingCommand) -> None:
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            self.checks.append(cmd)

    async def register(self) -> None:
        body = bodies.dumps(
            {"clientID": self.client_id, "producerDataSet": [{"groupName": self.group}], "consumerDataSet": []}
        )
        cmd = RemotingCommand(RequestCode.HEART_BEAT, ext_fields={"Authorization": f"Bearer {self.token}"}, body=body)
        resp = await self.client.invoke(self.cluster.broker_addr, cmd, 5000)
        assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)

    async def aclose(self) -> None:
        await self.client.close()


async def test_a_half_message_cannot_name_another_tenants_producer_group(tenancy: TenancyCluster) -> None:
    acme = await tenancy.new_tenant("acme")
    beta = await tenancy.new_tenant("beta")
    await tenancy.create_topic(acme, "orders")
    acme_p = Producer(tenancy, acme.token, "acme%tx", "acme-client")
    beta_p = Producer(tenancy, beta.token, "beta%tx", "beta-client")
    shared_p = Producer(tenancy, beta.token, "DEFAULT_PRODUCER", "beta-shared")
    try:
        for p in (acme_p, beta_p, shared_p):
            await p.register()

        # Control: acme's own transaction, in its own producer group (left unresolved: checked back).
        resp = await tenancy.invoke(tx_send("acme%orders", "acme%tx", None, b"own"), token=acme.token)
        assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)

        # The attacks: another tenant's producer group in PGROUP, in the header, or a shared group.
        attacks = [
            tx_send("acme%orders", "acme%tx", "beta%tx", b"secret-1"),
            tx_send("acme%orders", "beta%tx", None, b"secret-2"),
            tx_send("acme%orders", "DEFAULT_PRODUCER", None, b"secret-3"),
        ]
        for cmd in attacks:
            resp = await tenancy.invoke(cmd, token=acme.token)
            assert resp.code == ResponseCode.NO_PERMISSION, (resp.code, resp.remark)
            assert "producer group" in (resp.remark or ""), resp.remark

        # acme's own half is checked back to acme's producer (default transaction_timeout_ms: 6 s) ...
        await until(lambda: bool(acme_p.checks), "acme's own check", timeout_s=30.0)
        await asyncio.sleep(2.0)  # ... and any check of the attacks would have come in the same scan
        assert all(b"own" in c.body_bytes() for c in acme_p.checks)
        assert beta_p.checks == [], [c.body_bytes() for c in beta_p.checks]
        assert shared_p.checks == [], [c.body_bytes() for c in shared_p.checks]
    finally:
        for p in (acme_p, beta_p, shared_p):
            await p.aclose()
