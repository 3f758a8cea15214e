"""Plans and per-tenant quota overrides."""

from __future__ import annotations

from typing import Literal

from control_plane.db import Connection, Record
from control_plane.errors import PlanNotFound

# Each limit and its column's type, the same in plans and quota_overrides (0001_schema.sql);
# the API bounds each field to what its column holds.
LIMIT_COLUMNS: dict[str, Literal["integer", "bigint"]] = {
    "publish_msgs_per_s": "bigint",
    "publish_bytes_per_s": "bigint",
    "consume_msgs_per_s": "bigint",
    "consume_bytes_per_s": "bigint",
    "max_topics": "integer",
    "max_queues": "integer",
    "storage_bytes": "bigint",
    "max_retention_hours": "integer",
    "max_connections": "integer",  # to one broker (0002's plans got them in 0007)
    "max_inflight_requests": "integer",  # on one broker
}
# What a plan written without them gets (PUT /v1/plans/{plan} from before 0007 keeps working).
PLAN_DEFAULTS: dict[str, int] = {"max_connections": 1000, "max_inflight_requests": 10000}
LIMIT_FIELDS: tuple[str, ...] = tuple(LIMIT_COLUMNS)
_COLUMNS = ", ".join(LIMIT_FIELDS)


async def list_plans(conn: Connection) -> list[Record]:
    return await conn.fetch(f"SELECT name, {_COLUMNS}, updated_at FROM plans ORDER BY name")


async def get_plan(conn: Connection, name: str) -> Record:
    row = await conn.fetchrow(f"SELECT name, {_COLUMNS}, updated_at FROM plans WHERE name = $1", name)
    if row is None:
        raise PlanNotFound(f"no plan {name!r}", plan=name)
    return row


async def upsert_plan(conn: Connection, name: str, limits: dict[str, int]) -> tuple[Record, bool]:
    """Create or replace a plan; returns the row and whether it was created."""
    values = [limits[f] for f in LIMIT_FIELDS]
    placeholders = ", ".join(f"${i + 2}" for i in range(len(LIMIT_FIELDS)))
    updates = ", ".join(f"{f} = EXCLUDED.{f}" for f in LIMIT_FIELDS)
    row = await conn.fetchrow(
        f"""INSERT INTO plans (name, {_COLUMNS}) VALUES ($1, {placeholders})
            ON CONFLICT (name) DO UPDATE SET {updates}, updated_at = now()
            RETURNING name, {_COLUMNS}, updated_at, (xmax = 0) AS created""",
        name,
        *values,
    )
    assert row is not None
    return row, bool(row["created"])


async def get_overrides(conn: Connection, *, tenant_id: str) -> dict[str, int]:
    row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM quota_overrides WHERE tenant_id = $1", tenant_id)
    return {} if row is None else {k: v for k, v in row.items() if v is not None}


async def put_overrides(conn: Connection, *, tenant_id: str, overrides: dict[str, int | None]) -> None:
    """Replace the tenant's overrides: fields left out or null fall back to the plan."""
    values = [overrides.get(f) for f in LIMIT_FIELDS]
    placeholders = ", ".join(f"${i + 2}" for i in range(len(LIMIT_FIELDS)))
    updates = ", ".join(f"{f} = EXCLUDED.{f}" for f in LIMIT_FIELDS)
    await conn.execute(
        f"""INSERT INTO quota_overrides (tenant_id, {_COLUMNS}) VALUES ($1, {placeholders})
            ON CONFLICT (tenant_id) DO UPDATE SET {updates}, updated_at = now()""",
        tenant_id,
        *values,
    )


EFFECTIVE_LIMITS_SQL = f"""
    SELECT t.id AS tenant_id, t.plan,
           {", ".join(f"COALESCE(o.{f}, p.{f}) AS {f}" for f in LIMIT_FIELDS)}
    FROM tenants t
    JOIN plans p ON p.name = t.plan
    LEFT JOIN quota_overrides o ON o.tenant_id = t.id"""


async def effective_limits(conn: Connection, *, tenant_id: str) -> dict[str, int]:
    row = await conn.fetchrow(EFFECTIVE_LIMITS_SQL + " WHERE t.id = $1", tenant_id)
    if row is None:
        return {}
    return {f: int(row[f]) for f in LIMIT_FIELDS}
