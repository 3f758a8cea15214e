"""Broker host credentials: which broker credential (``credentials``, role broker) is the current
one of each host of a broker group (``broker_host_credentials``, one row per group and host).

Callers lock the broker group first (``fleet.lock_broker_group``, or the PATCH's own UPDATE of
its row), so issuing, rotating and the group's address changes are serialized per group.
"""

from __future__ import annotations

from control_plane.db import Connection, Record

_COLUMNS = """b.broker_group, b.host, b.access_key, c.status, c.created_at, c.revoked_at
    FROM broker_host_credentials b JOIN credentials c ON c.access_key = b.access_key"""


async def list_bound(conn: Connection, *, broker_group: str) -> list[Record]:
    """Each bound host of the group with its credential's access key, status and times."""
    return await conn.fetch(f"SELECT {_COLUMNS} WHERE b.broker_group = $1 ORDER BY b.host", broker_group)


async def get_bound(conn: Connection, *, broker_group: str, host: str) -> Record | None:
    return await conn.fetchrow(f"SELECT {_COLUMNS} WHERE b.broker_group = $1 AND b.host = $2", broker_group, host)


async def bind(conn: Connection, *, broker_group: str, host: str, access_key: str) -> None:
    """Make ``access_key`` the host's current credential (replacing the row's previous one)."""
    await conn.execute(
        """INSERT INTO broker_host_credentials (broker_group, host, access_key) VALUES ($1, $2, $3)
           ON CONFLICT (broker_group, host) DO UPDATE SET access_key = EXCLUDED.access_key, bound_at = now()""",
        broker_group,
        host,
        access_key,
    )


async def unbind_hosts_not_in(conn: Connection, *, broker_group: str, hosts: list[str]) -> list[Record]:
    """Remove the rows of the group's hosts not in ``hosts``; returns their (host, access_key)
    so the caller revokes those credentials in the same transaction."""
    return await conn.fetch(
        """DELETE FROM broker_host_credentials WHERE broker_group = $1 AND NOT (host = ANY($2::text[]))
           RETURNING host, access_key""",
        broker_group,
        hosts,
    )


async def unbind_all(conn: Connection, *, broker_group: str) -> list[Record]:
    """Remove every row of the group; returns their (host, access_key) for the caller to revoke
    in the same transaction."""
    return await conn.fetch(
        "DELETE FROM broker_host_credentials WHERE broker_group = $1 RETURNING host, access_key", broker_group
    )
