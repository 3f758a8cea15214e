"""Security: one tenant connection must not grow the broker's producer-group table without bound.

Heartbeats may name unprefixed producer groups (stock clients announce CLIENT_INNER_PRODUCER), and
any name in the tenant's own namespace. Before the fix the broker registered every name it was
sent — a connection could add hundreds of thousands of groups per heartbeat, again and again
(memory, and every connection close walks the whole table). ``MAX_GROUPS_PER_CLIENT`` existed but
was never enforced.
"""

from __future__ import annotations

import pytest

from data_plane.broker.client_manager import MAX_GROUPS_PER_CLIENT
from data_plane.remoting import bodies
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from tests.integration.tenancy_cluster import (
    TenancyCluster,
    tenancy_fixture,  # noqa: F401
)
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def heartbeat(token: str, groups: list[str]) -> RemotingCommand:
    body = bodies.dumps(
        {"clientID": "flooder", "producerDataSet": [{"groupName": g} for g in groups], "consumerDataSet": []}
    )
    return RemotingCommand(RequestCode.HEART_BEAT, ext_fields={"Authorization": f"Bearer {token}"}, body=body)


async def test_a_connection_cannot_register_unbounded_producer_groups(tenancy: TenancyCluster) -> None:
    acme = await tenancy.new_tenant("acme")
    client = RemotingClient()
    try:
        addr = tenancy.broker_addr
        first = [f"PG_{i}" for i in range(MAX_GROUPS_PER_CLIENT)]
        resp = await client.invoke(addr, heartbeat(acme.token, first), 10_000)
        assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
        # The same groups again: a renewal, not new registrations.
        resp = await client.invoke(addr, heartbeat(acme.token, first), 10_000)
        assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
        # Fresh names past the bound are refused, on this connection.
        more = [f"PG_X{i}" for i in range(5_000)] + [f"acme%pg{i}" for i in range(5_000)]
        resp = await client.invoke(addr, heartbeat(acme.token, more), 10_000)
        assert resp.code == ResponseCode.SYSTEM_BUSY, (resp.code, resp.remark)
        assert "producer groups" in (resp.remark or ""), resp.remark
    finally:
        await client.close()
    # A new connection (after this one's groups are forgotten) registers normally.
    client = RemotingClient()
    try:
        resp = await client.invoke(tenancy.broker_addr, heartbeat(acme.token, ["CLIENT_INNER_PRODUCER"]), 10_000)
        assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    finally:
        await client.close()
