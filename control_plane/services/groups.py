"""Consumer groups: retry policy, max retries, orderly consumption. Creation is idempotent like
topics: the same spec again answers the group, another spec is a conflict."""

from __future__ import annotations

from typing import Any

from control_plane.db import Pool
from control_plane.errors import GroupExists
from control_plane.repositories import groups as repo
from control_plane.repositories import jsonable
from control_plane.repositories import tenants as tenants_repo
from data_plane.tenancy.namespace import dlq_topic, retry_topic, wire_name

RETRY_POLICIES = ("exponential", "fixed")
DEFAULT_MAX_RETRIES = 16
DEFAULT_FIXED_INTERVAL_MS = 10_000
SPEC_FIELDS = ("retry_policy", "fixed_interval_ms", "max_retries", "consume_orderly", "description")


def _group(row: Any) -> dict[str, Any]:
    out = jsonable(row)
    out["wire_name"] = wire_name(row["tenant_id"], row["name"])
    out["retry_topic"] = retry_topic(row["tenant_id"], row["name"])
    out["dlq_topic"] = dlq_topic(row["tenant_id"], row["name"])
    return out


class GroupService:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def create(self, *, tenant_id: str, name: str, spec: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        async with self.pool.acquire() as conn, conn.transaction():
            await tenants_repo.get_tenant(conn, tenant_id=tenant_id, for_update=True)
            row = await repo.insert_group(conn, tenant_id=tenant_id, name=name, **spec)
            if row is not None:
                return _group(row), True
            existing = await repo.require_group(conn, tenant_id=tenant_id, name=name)
        if any(existing[k] != spec[k] for k in SPEC_FIELDS):
            raise GroupExists(f"consumer group {name!r} exists with another spec", tenant=tenant_id, group=name)
        return _group(existing), False

    async def get(self, *, tenant_id: str, name: str) -> dict[str, Any]:
        async with self.pool.acquire() as conn:
            await tenants_repo.get_tenant(conn, tenant_id=tenant_id)
            return _group(await repo.require_group(conn, tenant_id=tenant_id, name=name))

    async def list_groups(self, *, tenant_id: str) -> list[dict[str, Any]]:
        async with self.pool.acquire() as conn:
            await tenants_repo.get_tenant(conn, tenant_id=tenant_id)
            return [_group(r) for r in await repo.list_groups(conn, tenant_id=tenant_id)]

    async def update(self, *, tenant_id: str, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        async with self.pool.acquire() as conn, conn.transaction():
            await tenants_repo.get_tenant(conn, tenant_id=tenant_id)
            current = await repo.require_group(conn, tenant_id=tenant_id, name=name)
            spec: dict[str, Any] = {k: changes.get(k, current[k]) for k in SPEC_FIELDS}
            return _group(await repo.update_group(conn, tenant_id=tenant_id, name=name, **spec))

    async def delete(self, *, tenant_id: str, name: str) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await tenants_repo.get_tenant(conn, tenant_id=tenant_id)
            await repo.delete_group(conn, tenant_id=tenant_id, name=name)
