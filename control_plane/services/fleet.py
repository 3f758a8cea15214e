"""The broker fleet: broker groups, their hosts and capacity (operator business)."""

from __future__ import annotations

from typing import Any

from control_plane.db import Pool, Record
from control_plane.repositories import fleet as repo
from control_plane.repositories import jsonable


def _group(row: Record, hosts: list[Record]) -> dict[str, Any]:
    out = jsonable(row)
    out["free_queues"] = max(0, int(row["max_queues"]) - int(row["placed_queues"]))
    out["hosts"] = [jsonable(h, drop=("broker_group",)) for h in hosts]
    return out


class FleetService:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def create_group(
        self,
        *,
        name: str,
        namesrv_addrs: list[str],
        broker_addrs: list[str],
        max_queues: int,
        max_msgs_per_s: int,
        storage_bytes: int,
    ) -> dict[str, Any]:
        row = await repo.insert_broker_group(
            self.pool,
            name=name,
            namesrv_addrs=namesrv_addrs,
            broker_addrs=broker_addrs,
            max_queues=max_queues,
            max_msgs_per_s=max_msgs_per_s,
            storage_bytes=storage_bytes,
        )
        return _group(row, [])

    async def get_group(self, name: str) -> dict[str, Any]:
        async with self.pool.acquire() as conn:
            return _group(await repo.get_broker_group(conn, name), await repo.list_hosts(conn, name))

    async def list_groups(self) -> list[dict[str, Any]]:
        async with self.pool.acquire() as conn:
            return [_group(r, await repo.list_hosts(conn, r["name"])) for r in await repo.list_broker_groups(conn)]

    async def update_group(
        self,
        name: str,
        *,
        max_queues: int | None = None,
        max_msgs_per_s: int | None = None,
        storage_bytes: int | None = None,
        status: str | None = None,
        namesrv_addrs: list[str] | None = None,
        broker_addrs: list[str] | None = None,
    ) -> dict[str, Any]:
        await repo.update_broker_group(
            self.pool,
            name,
            namesrv_addrs=namesrv_addrs,
            broker_addrs=broker_addrs,
            max_queues=max_queues,
            max_msgs_per_s=max_msgs_per_s,
            storage_bytes=storage_bytes,
            status=status,
        )
        return await self.get_group(name)

    async def add_host(self, *, broker_group: str, broker_id: int, host: str, address: str) -> dict[str, Any]:
        row = await repo.upsert_host(
            self.pool, broker_group=broker_group, broker_id=broker_id, host=host, address=address
        )
        return jsonable(row)
