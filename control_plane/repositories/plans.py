"""Plans and per-tenant quota overrides."""

from __future__ import annotations

from typing import Literal, TypedDict, cast

from control_plane.db import Connection, Record
from control_plane.errors import PlanNotFound, TenantNotFound

ColumnType = Literal["integer", "bigint", "boolean"]
# Each limit and its column's type, the same in plans and quota_overrides (0001_schema.sql and
# later); the API bounds each field to what its column holds.
LIMIT_COLUMNS: dict[str, ColumnType] = {
    "publish_msgs_per_s": "bigint",
    "publish_bytes_per_s": "bigint",
    "consume_msgs_per_s": "bigint",
    "consume_bytes_per_s": "bigint",
    "max_topics": "integer",
    "max_queues": "integer",
    "storage_bytes": "bigint",  # on brokers' disks
    "max_retention_hours": "integer",  # of a topic's finite retention_hours
    "max_connections": "integer",  # to one broker (0002's plans got them in 0007)
    "max_inflight_requests": "integer",  # on one broker
    "unlimited_retention": "boolean",  # topics may ask for retention_hours "unlimited" (0009)
    "max_tiered_bytes": "bigint",  # in object storage; NULL in a plan: no cap (0009)
}
# Limits whose plan value may be NULL: no limit. (An override cannot lift a plan's cap to none,
# since a NULL override falls back to the plan; 2^62 is as good.)
NULLABLE_LIMITS = frozenset({"max_tiered_bytes"})
# What a plan holds besides its limits: prices, never overridden per tenant.
PRICE_COLUMNS: dict[str, ColumnType] = {
    # per GB-month (GB = 2^30 bytes) of tiered_bytes, in millionths of the billing currency
    "tiered_price_per_gb_month_micros": "bigint",
}
# What a plan written without them gets (PUT /v1/plans/{plan} from before 0007 and 0009 keeps working).
PLAN_DEFAULTS: dict[str, int | bool | None] = {
    "max_connections": 1000,
    "max_inflight_requests": 10000,
    "unlimited_retention": False,
    "max_tiered_bytes": None,
    "tiered_price_per_gb_month_micros": 0,
}
PLAN_COLUMNS: dict[str, ColumnType] = {**LIMIT_COLUMNS, **PRICE_COLUMNS}
LIMIT_FIELDS: tuple[str, ...] = tuple(LIMIT_COLUMNS)
PLAN_FIELDS: tuple[str, ...] = tuple(PLAN_COLUMNS)
_LIMITS = ", ".join(LIMIT_FIELDS)
_PLAN = ", ".join(PLAN_FIELDS)


class Limits(TypedDict):
    """A tenant's effective limits: its overrides, else its plan's."""

    publish_msgs_per_s: int
    publish_bytes_per_s: int
    consume_msgs_per_s: int
    consume_bytes_per_s: int
    max_topics: int
    max_queues: int
    storage_bytes: int
    max_retention_hours: int
    max_connections: int
    max_inflight_requests: int
    unlimited_retention: bool
    max_tiered_bytes: int | None


async def list_plans(conn: Connection) -> list[Record]:
    return await conn.fetch(f"SELECT name, {_PLAN}, updated_at FROM plans ORDER BY name")


async def get_plan(conn: Connection, name: str) -> Record:
    row = await conn.fetchrow(f"SELECT name, {_PLAN}, updated_at FROM plans WHERE name = $1", name)
    if row is None:
        raise PlanNotFound(f"no plan {name!r}", plan=name)
    return row


async def upsert_plan(conn: Connection, name: str, plan: dict[str, int | bool | None]) -> tuple[Record, bool]:
    """Create or replace a plan (every field of ``PLAN_FIELDS``); the row and whether it was created."""
    values = [plan[f] for f in PLAN_FIELDS]
    placeholders = ", ".join(f"${i + 2}" for i in range(len(PLAN_FIELDS)))
    updates = ", ".join(f"{f} = EXCLUDED.{f}" for f in PLAN_FIELDS)
    row = await conn.fetchrow(
        f"""INSERT INTO plans (name, {_PLAN}) VALUES ($1, {placeholders})
            ON CONFLICT (name) DO UPDATE SET {updates}, updated_at = now()
            RETURNING name, {_PLAN}, updated_at, (xmax = 0) AS created""",
        name,
        *values,
    )
    assert row is not None
    return row, bool(row["created"])


async def get_overrides(conn: Connection, *, tenant_id: str) -> dict[str, int | bool]:
    row = await conn.fetchrow(f"SELECT {_LIMITS} FROM quota_overrides WHERE tenant_id = $1", tenant_id)
    return {} if row is None else {k: v for k, v in row.items() if v is not None}


async def put_overrides(conn: Connection, *, tenant_id: str, overrides: dict[str, int | bool | None]) -> None:
    """Replace the tenant's overrides: fields left out or null fall back to the plan."""
    values = [overrides.get(f) for f in LIMIT_FIELDS]
    placeholders = ", ".join(f"${i + 2}" for i in range(len(LIMIT_FIELDS)))
    updates = ", ".join(f"{f} = EXCLUDED.{f}" for f in LIMIT_FIELDS)
    await conn.execute(
        f"""INSERT INTO quota_overrides (tenant_id, {_LIMITS}) VALUES ($1, {placeholders})
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


async def effective_limits(conn: Connection, *, tenant_id: str) -> Limits:
    row = await conn.fetchrow(EFFECTIVE_LIMITS_SQL + " WHERE t.id = $1", tenant_id)
    if row is None:
        raise TenantNotFound(f"no tenant {tenant_id!r}", tenant=tenant_id)
    return cast(Limits, {f: row[f] for f in LIMIT_FIELDS})
