"""Tenants, plans and quota overrides (operator business)."""

from __future__ import annotations

import logging
from typing import Any

from control_plane.db import Pool
from control_plane.repositories import credentials as credentials_repo
from control_plane.repositories import jsonable
from control_plane.repositories import plans as plans_repo
from control_plane.repositories import tenants as repo

log = logging.getLogger(__name__)


class TenantService:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def create(self, *, tenant_id: str, display_name: str, plan: str) -> dict[str, Any]:
        async with self.pool.acquire() as conn, conn.transaction():
            await plans_repo.get_plan(conn, plan)
            row = await repo.insert_tenant(conn, tenant_id=tenant_id, display_name=display_name, plan=plan)
        log.info("tenant %s created on plan %s", tenant_id, plan)
        return jsonable(row)

    async def get(self, *, tenant_id: str) -> dict[str, Any]:
        return jsonable(await repo.get_tenant(self.pool, tenant_id=tenant_id))

    async def list_tenants(self) -> list[dict[str, Any]]:
        return [jsonable(r) for r in await repo.list_tenants(self.pool)]

    async def update(self, *, tenant_id: str, display_name: str | None, plan: str | None) -> dict[str, Any]:
        async with self.pool.acquire() as conn, conn.transaction():
            if plan is not None:
                await plans_repo.get_plan(conn, plan)
            return jsonable(await repo.update_tenant(conn, tenant_id=tenant_id, display_name=display_name, plan=plan))

    async def set_status(self, *, tenant_id: str, status: str) -> dict[str, Any]:
        row = await repo.update_tenant(self.pool, tenant_id=tenant_id, status=status)
        log.info("tenant %s is now %s", tenant_id, status)
        return jsonable(row)

    async def delete(self, *, tenant_id: str) -> None:
        """Topics and groups go, credentials are revoked, the id stays taken."""
        async with self.pool.acquire() as conn, conn.transaction():
            await repo.get_tenant(conn, tenant_id=tenant_id, for_update=True)
            await credentials_repo.revoke_all_of_tenant(conn, tenant_id=tenant_id)
            await repo.delete_tenant(conn, tenant_id=tenant_id)
        log.info("tenant %s deleted", tenant_id)

    # --- plans and quotas -----------------------------------------------------------------
    async def list_plans(self) -> list[dict[str, Any]]:
        return [jsonable(r) for r in await plans_repo.list_plans(self.pool)]

    async def get_plan(self, name: str) -> dict[str, Any]:
        return jsonable(await plans_repo.get_plan(self.pool, name))

    async def put_plan(self, name: str, plan: dict[str, int | bool | None]) -> tuple[dict[str, Any], bool]:
        row, created = await plans_repo.upsert_plan(self.pool, name, plan)
        return jsonable(row, drop=("created",)), created

    async def quota(self, *, tenant_id: str) -> dict[str, Any]:
        async with self.pool.acquire() as conn:
            tenant = await repo.get_tenant(conn, tenant_id=tenant_id)
            return {
                "tenant_id": tenant_id,
                "plan": tenant["plan"],
                "overrides": await plans_repo.get_overrides(conn, tenant_id=tenant_id),
                "effective": await plans_repo.effective_limits(conn, tenant_id=tenant_id),
            }

    async def put_quota(self, *, tenant_id: str, overrides: dict[str, int | bool | None]) -> dict[str, Any]:
        async with self.pool.acquire() as conn, conn.transaction():
            await repo.get_tenant(conn, tenant_id=tenant_id, for_update=True)
            await plans_repo.put_overrides(conn, tenant_id=tenant_id, overrides=overrides)
        return await self.quota(tenant_id=tenant_id)
