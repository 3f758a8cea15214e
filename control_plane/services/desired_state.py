"""Desired state of one broker group, for the reconciler: everything the group's brokers must
hold, as plain JSON-ready dicts (``DesiredState``).

A tenant is on a broker group when one of its topics has queues there. The group gets those
topics (its share of queues), all consumer groups of those tenants (a consumer may read any of
their topics), their credentials plus every operator and broker credential (secrets decrypted:
brokers check RocketMQ ACL signatures with them; revoked ones come with an empty secret), and
each tenant's rate and storage quotas divided evenly over the active broker groups holding it.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import TypedDict

from control_plane.db import Pool
from control_plane.repositories import desired_state as repo
from control_plane.repositories import fleet as fleet_repo
from control_plane.services.credentials import CredentialService, DecryptedCredential
from data_plane.tenancy.namespace import dlq_topic, retry_topic, wire_name

PERM_READ = 4
PERM_WRITE = 2


class DesiredTopic(TypedDict):
    name: str  # wire name, "tenant%topic"
    tenant: str
    topic: str
    read_queue_nums: int
    write_queue_nums: int
    message_type: str  # NORMAL | FIFO | DELAY | TRANSACTION
    order: bool  # FIFO topics: ordered per sharding key
    perm: int  # RocketMQ permission bits, 6 = read + write
    retention_hours: int | None  # total, on disk and in object storage; None: unlimited
    local_retention_hours: int | None  # on the brokers' disks; None: the broker's default
    status: str  # provisioning | active


class DesiredGroup(TypedDict):
    name: str  # wire name, "tenant%group"
    tenant: str
    group: str
    retry_max_times: int
    consume_orderly: bool
    retry_policy: str  # exponential | fixed
    fixed_interval_ms: int
    retry_topic: str  # "%RETRY%tenant%group"
    dlq_topic: str  # "%DLQ%tenant%group"


class QuotaShare(TypedDict):
    publish_msgs_per_s: int
    publish_bytes_per_s: int
    consume_msgs_per_s: int
    consume_bytes_per_s: int
    storage_bytes: int  # on the brokers' disks
    max_tiered_bytes: int | None  # in object storage; None: no limit
    max_connections: int  # to each broker: the whole limit, not a share
    max_inflight_requests: int


class DesiredTenant(TypedDict):
    id: str
    status: str  # active | suspended
    broker_group_count: int  # active broker groups holding this tenant's topics
    quota: QuotaShare  # this group's share: the tenant's limit / broker_group_count, rounded up


class DesiredState(TypedDict):
    broker_group: str
    broker_group_status: str  # active | draining
    generated_at: str  # ISO 8601, UTC
    topics: list[DesiredTopic]
    groups: list[DesiredGroup]
    credentials: list[DecryptedCredential]
    tenants: list[DesiredTenant]


class DesiredStateService:
    def __init__(self, pool: Pool, credentials: CredentialService) -> None:
        self.pool = pool
        self.credentials = credentials

    async def desired_state(self, broker_group: str) -> DesiredState:
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
            group = await fleet_repo.get_broker_group(conn, broker_group)
            topic_rows = await repo.placed_topics(conn, broker_group)
            tenant_ids = sorted({r["tenant_id"] for r in topic_rows})
            group_rows = await repo.groups_of(conn, tenant_ids=tenant_ids)
            tenant_rows = await repo.tenants_with_limits(conn, tenant_ids=tenant_ids)
        topics: list[DesiredTopic] = [
            {
                "name": wire_name(r["tenant_id"], r["name"]),
                "tenant": r["tenant_id"],
                "topic": r["name"],
                "read_queue_nums": r["queue_count"],
                # Writable queues [0, write); none: the group only drains it (read-only, and
                # writeQueueNums at its least, 1, as brokers take no 0).
                "write_queue_nums": max(1, r["write_queue_count"]),
                "message_type": r["message_type"],
                "order": r["message_type"] == "FIFO",
                "perm": PERM_READ | PERM_WRITE if r["write_queue_count"] > 0 else PERM_READ,
                "retention_hours": r["retention_hours"],
                "local_retention_hours": r["local_retention_hours"],
                "status": r["status"],
            }
            for r in topic_rows
        ]
        groups: list[DesiredGroup] = [
            {
                "name": wire_name(r["tenant_id"], r["name"]),
                "tenant": r["tenant_id"],
                "group": r["name"],
                "retry_max_times": r["max_retries"],
                "consume_orderly": r["consume_orderly"],
                "retry_policy": r["retry_policy"],
                "fixed_interval_ms": r["fixed_interval_ms"],
                "retry_topic": retry_topic(r["tenant_id"], r["name"]),
                "dlq_topic": dlq_topic(r["tenant_id"], r["name"]),
            }
            for r in group_rows
        ]
        tenants: list[DesiredTenant] = []
        for r in tenant_rows:
            n = max(1, int(r["broker_group_count"]))
            share: QuotaShare = {
                "publish_msgs_per_s": math.ceil(r["publish_msgs_per_s"] / n),
                "publish_bytes_per_s": math.ceil(r["publish_bytes_per_s"] / n),
                "consume_msgs_per_s": math.ceil(r["consume_msgs_per_s"] / n),
                "consume_bytes_per_s": math.ceil(r["consume_bytes_per_s"] / n),
                "storage_bytes": math.ceil(r["storage_bytes"] / n),
                "max_tiered_bytes": None if r["max_tiered_bytes"] is None else math.ceil(r["max_tiered_bytes"] / n),
                "max_connections": int(r["max_connections"]),
                "max_inflight_requests": int(r["max_inflight_requests"]),
            }
            tenants.append({"id": r["tenant_id"], "status": r["status"], "broker_group_count": n, "quota": share})
        return {
            "broker_group": broker_group,
            "broker_group_status": group["status"],
            "generated_at": dt.datetime.now(dt.UTC).isoformat(),
            "topics": topics,
            "groups": groups,
            "credentials": await self.credentials.decrypted_credentials(tenant_ids=tenant_ids),
            "tenants": tenants,
        }
