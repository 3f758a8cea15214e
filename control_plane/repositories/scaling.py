"""The autoscaler's reads and writes: the topics it may change with their placements, writable
and read-only queue counts by broker group, and the scaling events tenants list."""

from __future__ import annotations

from typing import Any

from control_plane.db import Connection, Pool, Record
from control_plane.repositories.topics import sync_queue_count

MAX_EVENTS = 200


async def elastic_topics(pool: Pool) -> list[Record]:
    """Active topics of active tenants with their placements (one row a placement), the
    placement's broker group status and whether the reconciler has applied it."""
    async with pool.acquire() as conn:
        return await conn.fetch(
            """SELECT t.tenant_id, t.name, t.message_type, t.throughput_hint_msgs_per_s, t.status,
                      p.broker_group, p.queue_count, p.write_queue_count, p.applied, g.status AS group_status
               FROM topics t
               JOIN tenants tn ON tn.id = t.tenant_id AND tn.status = 'active'
               JOIN topic_placements p ON p.tenant_id = t.tenant_id AND p.topic = t.name
               JOIN broker_groups g ON g.name = p.broker_group
               ORDER BY t.tenant_id, t.name, p.broker_group"""
        )


async def lock_placements(conn: Connection, *, tenant_id: str, topic: str) -> list[Record]:
    """The topic's placements, locked (with the topic row) until the transaction ends."""
    await conn.execute("SELECT 1 FROM topics WHERE tenant_id = $1 AND name = $2 FOR UPDATE", tenant_id, topic)
    return await conn.fetch(
        "SELECT broker_group, queue_count, write_queue_count, applied FROM topic_placements"
        " WHERE tenant_id = $1 AND topic = $2 ORDER BY broker_group FOR UPDATE",
        tenant_id,
        topic,
    )


async def set_queues(conn: Connection, *, tenant_id: str, topic: str, group: str, read: int, write: int) -> None:
    """A placement's queues become ``[0, read)``, ``[0, write)`` writable (no queue: the row goes);
    not applied until the reconciler has told the group, and the topic provisioning meanwhile."""
    if read == 0:
        await conn.execute(
            "DELETE FROM topic_placements WHERE tenant_id = $1 AND topic = $2 AND broker_group = $3",
            tenant_id,
            topic,
            group,
        )
    else:
        await conn.execute(
            """UPDATE topic_placements SET queue_count = $4, write_queue_count = $5, applied = false
               WHERE tenant_id = $1 AND topic = $2 AND broker_group = $3""",
            tenant_id,
            topic,
            group,
            read,
            write,
        )
    await sync_queue_count(conn, tenant_id=tenant_id, topic=topic)
    await mark_provisioning(conn, tenant_id=tenant_id, topic=topic)


async def mark_provisioning(conn: Connection, *, tenant_id: str, topic: str) -> None:
    """The topic waits for the reconciler (``mark_applied`` makes it active again)."""
    await conn.execute(
        "UPDATE topics SET status = 'provisioning', updated_at = now() WHERE tenant_id = $1 AND name = $2",
        tenant_id,
        topic,
    )


async def add_event(
    conn: Connection,
    *,
    tenant_id: str,
    topic: str,
    action: str,
    write_queues: int,
    read_queues: int,
    publish_rate: float | None,
    reason: str,
) -> None:
    await conn.execute(
        """INSERT INTO topic_scaling_events (tenant_id, topic, action, write_queues, read_queues, publish_rate, reason)
           VALUES ($1, $2, $3, $4, $5, $6, $7)""",
        tenant_id,
        topic,
        action,
        write_queues,
        read_queues,
        publish_rate,
        reason[:1000],
    )


async def list_events(conn: Connection, *, tenant_id: str, topic: str, limit: int = MAX_EVENTS) -> list[Record]:
    return await conn.fetch(
        """SELECT at, action, write_queues, read_queues, publish_rate, reason FROM topic_scaling_events
           WHERE tenant_id = $1 AND topic = $2 ORDER BY at DESC, id DESC LIMIT $3""",
        tenant_id,
        topic,
        min(limit, MAX_EVENTS),
    )


def totals(placements: list[Record] | list[dict[str, Any]]) -> tuple[int, int]:
    """(writable, every) queue of the placements."""
    return sum(int(p["write_queue_count"]) for p in placements), sum(int(p["queue_count"]) for p in placements)
