"""The broker fleet: broker groups, their hosts and capacity (operator business), and the broker
credential of each host.

A broker host is the host part of one of its group's ``broker_addrs`` (``host_of``: ``HOST`` of
``HOST:PORT``, an IPv6 literal without its brackets) — the hosts the name servers accept the
group's registrations from. Each has at most one current broker credential
(``broker_host_credentials`` → ``credentials``, role broker, description ``broker host
GROUP/HOST``): issuing one for a host revokes the one it had, in the same transaction, under a lock
on the group's row; a PATCH whose ``broker_addrs`` no longer list a host revokes that host's
credential in its own transaction. Revoked credentials reach brokers and name servers as
``status: revoked`` in the reconciler's next snapshot, like any revocation.
"""

from __future__ import annotations

import logging
from typing import Any

from control_plane.db import Connection, Pool, Record
from control_plane.errors import BrokerGroupInUse, BrokerHostNotFound, CredentialNotFound
from control_plane.repositories import credentials as credentials_repo
from control_plane.repositories import fleet as repo
from control_plane.repositories import host_credentials as host_repo
from control_plane.repositories import jsonable
from control_plane.services.credentials import CredentialService

log = logging.getLogger(__name__)


def host_of(addr: str) -> str:
    """The host of ``HOST:PORT`` (``[v6]:PORT`` gives ``v6``)."""
    host = addr.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def hosts_of(broker_addrs: list[str]) -> list[str]:
    """The distinct hosts of ``broker_addrs``, in the order they are first listed."""
    return list(dict.fromkeys(host_of(a) for a in broker_addrs))


def _group(row: Record, hosts: list[Record]) -> dict[str, Any]:
    out = jsonable(row)
    out["free_queues"] = max(0, int(row["max_queues"]) - int(row["placed_queues"]))
    out["hosts"] = [jsonable(h, drop=("broker_group",)) for h in hosts]
    return out


def _require_listed_host(group: Record, host: str) -> None:
    """BrokerHostNotFound unless ``host`` is the host of one of the group's broker_addrs."""
    if host not in hosts_of(list(group["broker_addrs"])):
        raise BrokerHostNotFound(
            f"{host!r} is not a host of broker group {group['name']!r}: its broker_addrs are on "
            + (", ".join(repr(h) for h in hosts_of(group["broker_addrs"])) or "no host"),
            broker_group=group["name"],
            host=host,
            hosts=hosts_of(group["broker_addrs"]),
        )


async def _revoke_leaving(conn: Connection, *, broker_group: str, broker_addrs: list[str]) -> list[str]:
    """Revoke the credentials of the group's hosts not on ``broker_addrs`` and drop their
    bindings; returns the revoked access keys."""
    gone = await host_repo.unbind_hosts_not_in(conn, broker_group=broker_group, hosts=hosts_of(broker_addrs))
    if not gone:
        return []
    revoked = await credentials_repo.revoke_operator_and_broker(conn, access_keys=[r["access_key"] for r in gone])
    return [str(r["access_key"]) for r in revoked]


class FleetService:
    def __init__(self, pool: Pool, credentials: CredentialService) -> None:
        self.pool = pool
        self.credentials = credentials

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
        """Change the group; when ``broker_addrs`` drop a host, that host's broker credential is
        revoked in the same transaction."""
        async with self.pool.acquire() as conn, conn.transaction():
            row = await repo.update_broker_group(
                conn,
                name,
                namesrv_addrs=namesrv_addrs,
                broker_addrs=broker_addrs,
                max_queues=max_queues,
                max_msgs_per_s=max_msgs_per_s,
                storage_bytes=storage_bytes,
                status=status,
            )
            revoked = await _revoke_leaving(conn, broker_group=name, broker_addrs=list(row["broker_addrs"]))
        for access_key in revoked:
            log.info("broker host credential %s of group %s revoked: its host left broker_addrs", access_key, name)
        return await self.get_group(name)

    async def delete_group(self, name: str) -> dict[str, Any]:
        """Remove the group from the fleet: refused (BrokerGroupInUse) while topics have queues
        placed on it; else its hosts' broker credentials are revoked and the group, its hosts and
        their bindings are deleted, in one transaction under the group's lock."""
        async with self.pool.acquire() as conn, conn.transaction():
            await repo.lock_broker_group(conn, name=name)
            placed = await repo.placed_queues(conn, name=name)
            if placed:
                raise BrokerGroupInUse(
                    f"broker group {name!r} still holds {placed} queue(s) of topics: delete or move those "
                    "topics first (PATCH status draining keeps new queues off it)",
                    broker_group=name,
                    placed_queues=placed,
                )
            unbound = await host_repo.unbind_all(conn, broker_group=name)
            revoked = await credentials_repo.revoke_operator_and_broker(
                conn, access_keys=[r["access_key"] for r in unbound]
            )
            await repo.delete_broker_group(conn, name=name)
        keys = [str(r["access_key"]) for r in revoked]
        log.info("broker group %s deleted; host credentials revoked: %s", name, ", ".join(keys) or "none")
        return {"broker_group": name, "deleted": True, "revoked_access_keys": keys}

    async def add_host(self, *, broker_group: str, broker_id: int, host: str, address: str) -> dict[str, Any]:
        row = await repo.upsert_host(
            self.pool, broker_group=broker_group, broker_id=broker_id, host=host, address=address
        )
        return jsonable(row)

    # --- broker host credentials ----------------------------------------------------------------
    async def list_host_credentials(self, *, broker_group: str) -> list[dict[str, Any]]:
        """Each host of the group's broker_addrs with its addresses and its credential's access
        key, status and times (``status`` "none" and nulls when it has none). Never a secret."""
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
            group = await repo.get_broker_group(conn, broker_group)
            bound = {r["host"]: r for r in await host_repo.list_bound(conn, broker_group=broker_group)}
        none = {"access_key": None, "status": "none", "created_at": None, "revoked_at": None}
        return [
            {
                "host": host,
                "broker_addrs": [a for a in group["broker_addrs"] if host_of(a) == host],
                **(none if host not in bound else jsonable(bound[host], drop=("broker_group", "host"))),
            }
            for host in hosts_of(list(group["broker_addrs"]))
        ]

    async def issue_host_credential(self, *, broker_group: str, host: str) -> dict[str, Any]:
        """A new broker credential for ``host`` of ``broker_group`` (answer with ``secret``, shown
        this once, and ``replaced``: the access key revoked in its favour, or null)."""
        minted = await self.credentials.mint()
        async with self.pool.acquire() as conn, conn.transaction():
            group = await repo.lock_broker_group(conn, name=broker_group)
            _require_listed_host(group, host)
            previous = await host_repo.get_bound(conn, broker_group=broker_group, host=host)
            replaced = None
            if previous is not None:
                await credentials_repo.revoke_operator_and_broker(conn, access_keys=[previous["access_key"]])
                replaced = str(previous["access_key"])
            made = await self.credentials.insert(
                conn, minted, tenant_id=None, role="broker", description=f"broker host {broker_group}/{host}"
            )
            await host_repo.bind(conn, broker_group=broker_group, host=host, access_key=minted.access_key)
        log.info(
            "broker host credential %s issued for %s/%s%s",
            minted.access_key,
            broker_group,
            host,
            f", {replaced} revoked" if replaced else "",
        )
        return {"broker_group": broker_group, "host": host, **made, "replaced": replaced}

    async def revoke_host_credential(self, *, broker_group: str, host: str) -> dict[str, Any]:
        """Revoke the host's current credential (again: no change). CredentialNotFound when the
        host never had one."""
        async with self.pool.acquire() as conn, conn.transaction():
            group = await repo.lock_broker_group(conn, name=broker_group)
            _require_listed_host(group, host)
            bound = await host_repo.get_bound(conn, broker_group=broker_group, host=host)
            if bound is None:
                raise CredentialNotFound(
                    f"host {host!r} of broker group {broker_group!r} has no broker credential",
                    broker_group=broker_group,
                    host=host,
                )
            (row,) = await credentials_repo.revoke_operator_and_broker(conn, access_keys=[bound["access_key"]])
        log.info("broker host credential %s of %s/%s revoked", row["access_key"], broker_group, host)
        return {"broker_group": broker_group, "host": host, **jsonable(row)}
