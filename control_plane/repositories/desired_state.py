"""The reads behind ``desired_state(broker_group)``: what one broker group must hold."""

from __future__ import annotations

from control_plane.db import Connection, Record
from control_plane.repositories.plans import EFFECTIVE_LIMITS_SQL


async def placed_topics(conn: Connection, broker_group: str) -> list[Record]:
    return await conn.fetch(
        """SELECT t.tenant_id, t.name, t.message_type, t.retention_hours, t.local_retention_hours, t.status,
                  p.queue_count, p.write_queue_count
           FROM topic_placements p
           JOIN topics t ON t.tenant_id = p.tenant_id AND t.name = p.topic
           JOIN tenants tn ON tn.id = t.tenant_id
           WHERE p.broker_group = $1 AND tn.status <> 'deleted'
           ORDER BY t.tenant_id, t.name""",
        broker_group,
    )


async def groups_of(conn: Connection, *, tenant_ids: list[str]) -> list[Record]:
    return await conn.fetch(
        """SELECT tenant_id, name, retry_policy, fixed_interval_ms, max_retries, consume_orderly
           FROM consumer_groups WHERE tenant_id = ANY($1::text[]) ORDER BY tenant_id, name""",
        tenant_ids,
    )


async def tenants_with_limits(conn: Connection, *, tenant_ids: list[str]) -> list[Record]:
    """Each tenant's status, effective limits and how many broker groups hold its topics."""
    return await conn.fetch(
        f"""SELECT e.*, tn.status,
                   (SELECT count(DISTINCT p.broker_group) FROM topic_placements p
                    JOIN broker_groups g ON g.name = p.broker_group AND g.status = 'active'
                    WHERE p.tenant_id = e.tenant_id)::integer AS broker_group_count
            FROM ({EFFECTIVE_LIMITS_SQL}) e JOIN tenants tn ON tn.id = e.tenant_id
            WHERE e.tenant_id = ANY($1::text[]) ORDER BY e.tenant_id""",
        tenant_ids,
    )
