"""Broker groups (one master and its slaves, named as on the wire), their hosts and capacity."""

from __future__ import annotations

from control_plane.db import Connection, Record, UniqueViolation
from control_plane.errors import BrokerGroupExists, BrokerGroupNotFound

_COLUMNS = "name, namesrv_addrs, broker_addrs, max_queues, max_msgs_per_s, storage_bytes, status, created_at"
_WITH_USED = f"""
    SELECT {", ".join("g." + c for c in _COLUMNS.split(", "))},
           COALESCE((SELECT sum(p.queue_count) FROM topic_placements p WHERE p.broker_group = g.name), 0)::integer
               AS placed_queues
    FROM broker_groups g"""


def _not_found(name: str) -> BrokerGroupNotFound:
    return BrokerGroupNotFound(f"no broker group {name!r}", broker_group=name)


async def insert_broker_group(
    conn: Connection,
    *,
    name: str,
    namesrv_addrs: list[str],
    broker_addrs: list[str],
    max_queues: int,
    max_msgs_per_s: int,
    storage_bytes: int,
) -> Record:
    try:
        await conn.execute(
            """INSERT INTO broker_groups (name, namesrv_addrs, broker_addrs, max_queues, max_msgs_per_s, storage_bytes)
               VALUES ($1, $2, $3, $4, $5, $6)""",
            name,
            namesrv_addrs,
            broker_addrs,
            max_queues,
            max_msgs_per_s,
            storage_bytes,
        )
    except UniqueViolation:
        raise BrokerGroupExists(f"broker group {name!r} exists", broker_group=name) from None
    return await get_broker_group(conn, name)


async def get_broker_group(conn: Connection, name: str) -> Record:
    row = await conn.fetchrow(_WITH_USED + " WHERE g.name = $1", name)
    if row is None:
        raise _not_found(name)
    return row


async def lock_broker_group(conn: Connection, *, name: str) -> Record:
    """The group's name and broker_addrs, its row locked until the transaction ends."""
    row = await conn.fetchrow("SELECT name, broker_addrs FROM broker_groups WHERE name = $1 FOR UPDATE", name)
    if row is None:
        raise _not_found(name)
    return row


async def delete_broker_group(conn: Connection, *, name: str) -> None:
    """Delete the group's row (its ``broker_hosts`` go with it); the caller has locked it and
    removed what else names it."""
    done = await conn.execute("DELETE FROM broker_groups WHERE name = $1", name)
    if done == "DELETE 0":
        raise _not_found(name)


async def placed_queues(conn: Connection, *, name: str) -> int:
    """The queues topics have placed on the group."""
    n = await conn.fetchval(
        "SELECT COALESCE(sum(queue_count), 0)::integer FROM topic_placements WHERE broker_group = $1", name
    )
    return int(n)


async def list_broker_groups(conn: Connection) -> list[Record]:
    return await conn.fetch(_WITH_USED + " ORDER BY g.name")


async def update_broker_group(
    conn: Connection,
    name: str,
    *,
    max_queues: int | None,
    max_msgs_per_s: int | None,
    storage_bytes: int | None,
    status: str | None,
    namesrv_addrs: list[str] | None = None,
    broker_addrs: list[str] | None = None,
) -> Record:
    done = await conn.execute(
        """UPDATE broker_groups SET max_queues = COALESCE($2, max_queues),
                  max_msgs_per_s = COALESCE($3, max_msgs_per_s), storage_bytes = COALESCE($4, storage_bytes),
                  status = COALESCE($5, status), namesrv_addrs = COALESCE($6, namesrv_addrs),
                  broker_addrs = COALESCE($7, broker_addrs)
           WHERE name = $1""",
        name,
        max_queues,
        max_msgs_per_s,
        storage_bytes,
        status,
        namesrv_addrs,
        broker_addrs,
    )
    if done == "UPDATE 0":
        raise _not_found(name)
    return await get_broker_group(conn, name)


async def lock_active_groups(conn: Connection) -> list[Record]:
    """Active broker groups with their placed queues, locked until the transaction ends, so
    concurrent placements see each other's queues."""
    await conn.execute("SELECT name FROM broker_groups WHERE status = 'active' ORDER BY name FOR UPDATE")
    return await conn.fetch(_WITH_USED + " WHERE g.status = 'active' ORDER BY g.name")


async def upsert_host(conn: Connection, *, broker_group: str, broker_id: int, host: str, address: str) -> Record:
    await get_broker_group(conn, broker_group)
    row = await conn.fetchrow(
        """INSERT INTO broker_hosts (broker_group, broker_id, host, address) VALUES ($1, $2, $3, $4)
           ON CONFLICT (broker_group, broker_id) DO UPDATE SET host = EXCLUDED.host, address = EXCLUDED.address
           RETURNING broker_group, broker_id, host, address, created_at""",
        broker_group,
        broker_id,
        host,
        address,
    )
    assert row is not None
    return row


async def list_hosts(conn: Connection, broker_group: str) -> list[Record]:
    return await conn.fetch(
        "SELECT broker_group, broker_id, host, address, created_at FROM broker_hosts"
        " WHERE broker_group = $1 ORDER BY broker_id",
        broker_group,
    )
