"""Load history in end-to-end tests: a tenant sends with the SDK producer and consumes an exact
number of messages with the SDK pull consumer (committing exactly those), and the control plane's
stored history (``/lag``, ``/load``) is polled for what the broker's load reports said."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sdk import Message, Producer
from sdk.consumer import ConsumeFrom
from sdk.message import MessageExt, MessageQueue
from sdk.pull_consumer import PullConsumer
from tests.integration.tenancy_cluster import TenancyCluster, Tenant, until


async def send(cluster: TenancyCluster, tenant: Tenant, topic: str, n: int) -> None:
    creds = tenant.credentials(cluster)
    async with Producer(f"{tenant.id}%load-producer", namesrv_addrs=cluster.namesrv.address, credentials=creds) as p:
        for i in range(n):
            await p.send(Message(f"{tenant.id}%{topic}", f"m-{i}".encode()))


class Taker:
    """Consumes messages in the order the consumer polls them, committing exactly those taken."""

    def __init__(self, consumer: PullConsumer) -> None:
        self.consumer = consumer
        self.buffer: list[MessageExt] = []
        self.next: dict[MessageQueue, int] = {}  # queue -> the offset after the last message taken

    async def take(self, m: int) -> None:
        while len(self.buffer) < m:
            self.buffer += await self.consumer.poll(timeout_ms=1000)
        taken, self.buffer = self.buffer[:m], self.buffer[m:]
        for msg in taken:
            mq = MessageQueue(msg.topic, msg.broker_name, msg.queue_id)
            self.next[mq] = max(self.next.get(mq, 0), msg.queue_offset + 1)
        await self.consumer.commit(dict(self.next))


@asynccontextmanager
async def taker(cluster: TenancyCluster, tenant: Tenant, group: str, topic: str) -> AsyncIterator[Taker]:
    consumer = PullConsumer(
        f"{tenant.id}%{group}",
        namesrv_addrs=cluster.namesrv.address,
        credentials=tenant.credentials(cluster),
        consume_from=ConsumeFrom.FIRST_OFFSET,
        instance_name=f"load-{group}",
    )
    consumer.subscribe(f"{tenant.id}%{topic}")
    await consumer.start()
    try:
        yield Taker(consumer)
    finally:
        await consumer.shutdown()


async def lag(cluster: TenancyCluster, tenant: Tenant, group: str, topic: str, query: str = "") -> dict[str, Any]:
    reply = await cluster.cp.call(
        "GET", f"/v1/tenants/{tenant.id}/groups/{group}/lag?topic={topic}{query}", token=tenant.token
    )
    assert reply.status == 200, reply.body
    return dict(reply.body)


def latest(buckets: list[dict[str, Any]], field: str) -> float | None:
    """The last bucket's ``field`` that has one (None: none has)."""
    found: float | None = next((b[field] for b in reversed(buckets) if b[field] is not None), None)
    return found


async def stored_backlog(cluster: TenancyCluster, tenant: Tenant, group: str, topic: str, backlog: int) -> None:
    """Wait until the stored history's latest backlog is ``backlog``."""

    async def there() -> bool:
        return latest((await lag(cluster, tenant, group, topic))["buckets"], "backlog") == backlog

    await until(there, f"a stored backlog of {backlog} for {group} on {topic}", timeout_s=30)


async def reported_empty(cluster: TenancyCluster, topic: str) -> None:
    """Wait until the broker reported ``topic`` with nothing appended (so that what is sent next
    shows as a publish rate)."""
    query = "SELECT count(*) FROM topic_load_samples WHERE topic = $1 AND appended = 0"

    async def reported() -> bool:
        count: int = await cluster.services.pool.fetchval(query, topic)
        return count > 0

    await until(reported, f"a load report of the empty topic {topic}")
