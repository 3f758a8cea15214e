"""Consumer groups."""

from __future__ import annotations

from control_plane.db import Connection, Record
from control_plane.errors import GroupNotFound

_COLUMNS = "tenant_id, name, retry_policy, fixed_interval_ms, max_retries, consume_orderly, description, created_at"


def _not_found(tenant_id: str, name: str) -> GroupNotFound:
    return GroupNotFound(f"no consumer group {name!r} in tenant {tenant_id!r}", tenant=tenant_id, group=name)


async def get_group(conn: Connection, *, tenant_id: str, name: str) -> Record | None:
    return await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM consumer_groups WHERE tenant_id = $1 AND name = $2", tenant_id, name
    )


async def require_group(conn: Connection, *, tenant_id: str, name: str) -> Record:
    row = await get_group(conn, tenant_id=tenant_id, name=name)
    if row is None:
        raise _not_found(tenant_id, name)
    return row


async def list_groups(conn: Connection, *, tenant_id: str) -> list[Record]:
    return await conn.fetch(f"SELECT {_COLUMNS} FROM consumer_groups WHERE tenant_id = $1 ORDER BY name", tenant_id)


async def insert_group(
    conn: Connection,
    *,
    tenant_id: str,
    name: str,
    retry_policy: str,
    fixed_interval_ms: int,
    max_retries: int,
    consume_orderly: bool,
    description: str,
) -> Record | None:
    """The new row, or None when a group of that name exists."""
    return await conn.fetchrow(
        f"""INSERT INTO consumer_groups (tenant_id, name, retry_policy, fixed_interval_ms, max_retries,
                                         consume_orderly, description)
            VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING RETURNING {_COLUMNS}""",
        tenant_id,
        name,
        retry_policy,
        fixed_interval_ms,
        max_retries,
        consume_orderly,
        description,
    )


async def update_group(
    conn: Connection,
    *,
    tenant_id: str,
    name: str,
    retry_policy: str,
    fixed_interval_ms: int,
    max_retries: int,
    consume_orderly: bool,
    description: str,
) -> Record:
    row = await conn.fetchrow(
        f"""UPDATE consumer_groups SET retry_policy = $3, fixed_interval_ms = $4, max_retries = $5,
                   consume_orderly = $6, description = $7
            WHERE tenant_id = $1 AND name = $2 RETURNING {_COLUMNS}""",
        tenant_id,
        name,
        retry_policy,
        fixed_interval_ms,
        max_retries,
        consume_orderly,
        description,
    )
    if row is None:
        raise _not_found(tenant_id, name)
    return row


async def delete_group(conn: Connection, *, tenant_id: str, name: str) -> None:
    done = await conn.execute("DELETE FROM consumer_groups WHERE tenant_id = $1 AND name = $2", tenant_id, name)
    if done == "DELETE 0":
        raise _not_found(tenant_id, name)
