"""Topics and their placements (topic, broker group, queue count) on the broker fleet."""

from __future__ import annotations

from control_plane.db import Connection, Record
from control_plane.errors import TopicNotFound

# retention_hours NULL: unlimited; local_retention_hours NULL: the broker's default (0009).
_COLUMNS = (
    "tenant_id, name, message_type, retention_hours, local_retention_hours, throughput_hint_msgs_per_s, queue_count,"
    " description, status, created_at, updated_at"
)


def _not_found(tenant_id: str, name: str) -> TopicNotFound:
    return TopicNotFound(f"no topic {name!r} in tenant {tenant_id!r}", tenant=tenant_id, topic=name)


async def get_topic(conn: Connection, *, tenant_id: str, name: str, for_update: bool = False) -> Record | None:
    lock = " FOR UPDATE" if for_update else ""
    return await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM topics WHERE tenant_id = $1 AND name = $2{lock}", tenant_id, name
    )


async def require_topic(conn: Connection, *, tenant_id: str, name: str, for_update: bool = False) -> Record:
    row = await get_topic(conn, tenant_id=tenant_id, name=name, for_update=for_update)
    if row is None:
        raise _not_found(tenant_id, name)
    return row


async def list_topics(conn: Connection, *, tenant_id: str) -> list[Record]:
    return await conn.fetch(f"SELECT {_COLUMNS} FROM topics WHERE tenant_id = $1 ORDER BY name", tenant_id)


async def count_topics_and_queues(conn: Connection, *, tenant_id: str) -> tuple[int, int]:
    row = await conn.fetchrow(
        "SELECT count(*)::integer AS topics, COALESCE(sum(queue_count), 0)::integer AS queues"
        " FROM topics WHERE tenant_id = $1",
        tenant_id,
    )
    assert row is not None
    return int(row["topics"]), int(row["queues"])


async def insert_topic(
    conn: Connection,
    *,
    tenant_id: str,
    name: str,
    message_type: str,
    retention_hours: int | None,
    local_retention_hours: int | None,
    throughput_hint_msgs_per_s: int | None,
    queue_count: int,
    description: str,
) -> Record:
    row = await conn.fetchrow(
        f"""INSERT INTO topics (tenant_id, name, message_type, retention_hours, local_retention_hours,
                                throughput_hint_msgs_per_s, queue_count, description)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING {_COLUMNS}""",
        tenant_id,
        name,
        message_type,
        retention_hours,
        local_retention_hours,
        throughput_hint_msgs_per_s,
        queue_count,
        description,
    )
    assert row is not None
    return row


async def update_topic(
    conn: Connection,
    *,
    tenant_id: str,
    name: str,
    retention_hours: int | None,
    local_retention_hours: int | None,
    throughput_hint_msgs_per_s: int | None,
    queue_count: int,
    description: str,
    status: str,
) -> Record:
    row = await conn.fetchrow(
        f"""UPDATE topics SET retention_hours = $3, local_retention_hours = $4, throughput_hint_msgs_per_s = $5,
                   queue_count = $6, description = $7, status = $8, updated_at = now()
            WHERE tenant_id = $1 AND name = $2 RETURNING {_COLUMNS}""",
        tenant_id,
        name,
        retention_hours,
        local_retention_hours,
        throughput_hint_msgs_per_s,
        queue_count,
        description,
        status,
    )
    assert row is not None
    return row


async def delete_topic(conn: Connection, *, tenant_id: str, name: str) -> None:
    done = await conn.execute("DELETE FROM topics WHERE tenant_id = $1 AND name = $2", tenant_id, name)
    if done == "DELETE 0":
        raise _not_found(tenant_id, name)


async def add_placements(conn: Connection, *, tenant_id: str, topic: str, queues_by_group: dict[str, int]) -> None:
    """Add writable queues on broker groups, marked not applied until the reconciler has caught
    up. On a group already holding the topic, its read-only queues (being drained) take messages
    again first, then new queues are added: the writable ones stay ``[0, write_queue_count)``."""
    await conn.executemany(
        """INSERT INTO topic_placements (tenant_id, topic, broker_group, queue_count, write_queue_count)
           VALUES ($1, $2, $3, $4, $4)
           ON CONFLICT (tenant_id, topic, broker_group)
           DO UPDATE SET write_queue_count = topic_placements.write_queue_count + EXCLUDED.queue_count,
                         queue_count = GREATEST(topic_placements.queue_count,
                                                topic_placements.write_queue_count + EXCLUDED.queue_count),
                         applied = false""",
        [(tenant_id, topic, group, n) for group, n in sorted(queues_by_group.items()) if n > 0],
    )
    await sync_queue_count(conn, tenant_id=tenant_id, topic=topic)


async def sync_queue_count(conn: Connection, *, tenant_id: str, topic: str) -> None:
    """The topic's ``queue_count``: every queue of its placements, writable or draining."""
    await conn.execute(
        """UPDATE topics SET queue_count = GREATEST(1, (SELECT COALESCE(sum(queue_count), 0) FROM topic_placements
                                                        WHERE tenant_id = $1 AND topic = $2))
           WHERE tenant_id = $1 AND name = $2""",
        tenant_id,
        topic,
    )


async def placements_of(conn: Connection, *, tenant_id: str, topic: str) -> list[Record]:
    return await conn.fetch(
        "SELECT broker_group, queue_count, write_queue_count, applied FROM topic_placements"
        " WHERE tenant_id = $1 AND topic = $2 ORDER BY broker_group",
        tenant_id,
        topic,
    )


async def placements_by_topic(conn: Connection, *, tenant_id: str) -> dict[str, list[Record]]:
    """Every placement of the tenant's topics in one query, by topic (each topic's by broker group)."""
    rows = await conn.fetch(
        "SELECT topic, broker_group, queue_count, write_queue_count, applied FROM topic_placements"
        " WHERE tenant_id = $1 ORDER BY topic, broker_group",
        tenant_id,
    )
    out: dict[str, list[Record]] = {}
    for r in rows:
        out.setdefault(r["topic"], []).append(r)
    return out


async def mark_applied(conn: Connection, *, tenant_id: str, topic: str, broker_group: str | None) -> str:
    """Mark one placement (or all, when ``broker_group`` is None) applied; the topic turns
    ``active`` once all its placements are. Returns the topic's status."""
    await require_topic(conn, tenant_id=tenant_id, name=topic, for_update=True)
    await conn.execute(
        "UPDATE topic_placements SET applied = true"
        " WHERE tenant_id = $1 AND topic = $2 AND ($3::text IS NULL OR broker_group = $3)",
        tenant_id,
        topic,
        broker_group,
    )
    status: str = await conn.fetchval(
        """UPDATE topics SET status = CASE WHEN EXISTS (
               SELECT 1 FROM topic_placements p WHERE p.tenant_id = $1 AND p.topic = $2 AND NOT p.applied)
               THEN 'provisioning' ELSE 'active' END, updated_at = now()
           WHERE tenant_id = $1 AND name = $2 RETURNING status""",
        tenant_id,
        topic,
    )
    return status
