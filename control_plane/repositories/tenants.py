"""Tenants. A deleted tenant keeps its row (its id stays taken, its usage history keeps a name)
but is invisible to every read here."""

from __future__ import annotations

from control_plane.db import Connection, Record, UniqueViolation
from control_plane.errors import TenantExists, TenantNotFound

_COLUMNS = "id, display_name, plan, status, created_at, updated_at"


def _not_found(tenant_id: str) -> TenantNotFound:
    return TenantNotFound(f"no tenant {tenant_id!r}", tenant=tenant_id)


async def insert_tenant(conn: Connection, *, tenant_id: str, display_name: str, plan: str) -> Record:
    try:
        row = await conn.fetchrow(
            f"INSERT INTO tenants (id, display_name, plan) VALUES ($1, $2, $3) RETURNING {_COLUMNS}",
            tenant_id,
            display_name,
            plan,
        )
    except UniqueViolation:
        raise TenantExists(f"tenant {tenant_id!r} exists (or existed)", tenant=tenant_id) from None
    assert row is not None
    return row


async def get_tenant(conn: Connection, *, tenant_id: str, for_update: bool = False) -> Record:
    lock = " FOR UPDATE" if for_update else ""
    row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM tenants WHERE id = $1 AND status <> 'deleted'{lock}", tenant_id)
    if row is None:
        raise _not_found(tenant_id)
    return row


async def list_tenants(conn: Connection) -> list[Record]:
    return await conn.fetch(f"SELECT {_COLUMNS} FROM tenants WHERE status <> 'deleted' ORDER BY id")


async def update_tenant(
    conn: Connection,
    *,
    tenant_id: str,
    display_name: str | None = None,
    plan: str | None = None,
    status: str | None = None,
) -> Record:
    row = await conn.fetchrow(
        f"""UPDATE tenants SET display_name = COALESCE($2, display_name), plan = COALESCE($3, plan),
                   status = COALESCE($4, status), updated_at = now()
            WHERE id = $1 AND status <> 'deleted' RETURNING {_COLUMNS}""",
        tenant_id,
        display_name,
        plan,
        status,
    )
    if row is None:
        raise _not_found(tenant_id)
    return row


async def delete_tenant(conn: Connection, *, tenant_id: str) -> None:
    """Mark deleted and drop its topics and groups (the reconciler removes them from brokers)."""
    await conn.execute("DELETE FROM topics WHERE tenant_id = $1", tenant_id)
    await conn.execute("DELETE FROM consumer_groups WHERE tenant_id = $1", tenant_id)
    await conn.execute("UPDATE tenants SET status = 'deleted', updated_at = now() WHERE id = $1", tenant_id)
