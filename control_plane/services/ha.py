"""HaService: the leases behind automatic failover (docs/ha.md#failover).

Every member of a broker group calls ``heartbeat`` every ``failover_check_interval_s`` with what
it knows of itself. In one transaction, the group's row locked (``SELECT ... FOR UPDATE``), so
two members never both win:

- the master of the current epoch renews its lease (now + ``lease_s``);
- once the lease has run out, the live member (seen within ``lease_s``) whose CommitLog reaches
  furthest becomes master under epoch + 1 (ties: the lowest member id); it may be the old master
  itself, back in time;
- a new group waits ``lease_s`` for its configured master (member 0) before electing anyone, so
  a slave that starts first does not take over;
- everyone else is told the epoch and the master's addresses, and follows.

A master that cannot renew stops writing on its own clock before the lease ends here
(data_plane/broker/failover.py), so an old master and a new one never both take writes.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from control_plane.db import Pool

ROLES = ("SYNC_MASTER", "ASYNC_MASTER")


class HaService:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def heartbeat(
        self,
        *,
        cluster: str,
        broker_name: str,
        member_id: int,
        addr: str,
        ha_addr: str,
        max_offset: int,
        epoch: int,
        acting_master: bool,
        master_role: str | None,
        lag_bytes: int | None,
        lease_s: float,
    ) -> dict[str, Any]:
        lease = dt.timedelta(seconds=lease_s)
        async with self.pool.acquire() as conn, conn.transaction():
            now: dt.datetime = await conn.fetchval("SELECT now()")
            await conn.execute(
                """INSERT INTO ha_group (cluster_name, broker_name, lease_expires_at, master_role)
                   VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING""",
                cluster, broker_name, now + lease, master_role or "SYNC_MASTER",
            )  # fmt: skip
            group = await conn.fetchrow(
                "SELECT * FROM ha_group WHERE cluster_name = $1 AND broker_name = $2 FOR UPDATE", cluster, broker_name
            )
            assert group is not None
            await conn.execute(
                """INSERT INTO ha_member AS m (cluster_name, broker_name, member_id, addr, ha_addr, max_offset, epoch,
                                               acting_master, lag_bytes, last_seen)
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                   ON CONFLICT (cluster_name, broker_name, member_id) DO UPDATE
                   SET addr = $4, ha_addr = $5, max_offset = $6, epoch = $7, acting_master = $8, lag_bytes = $9,
                       last_seen = $10""",
                cluster, broker_name, member_id, addr, ha_addr, max_offset, epoch, acting_master, lag_bytes, now,
            )  # fmt: skip
            g_epoch = int(group["epoch"])
            master_id = group["master_id"]
            expired = group["lease_expires_at"] <= now
            if master_id == member_id and not expired:
                await conn.execute(
                    "UPDATE ha_group SET lease_expires_at = $3 WHERE cluster_name = $1 AND broker_name = $2",
                    cluster, broker_name, now + lease,
                )  # fmt: skip
                return _answer("MASTER", g_epoch, group["master_role"], lease_s, addr, ha_addr)
            if master_id is None and not expired and member_id == 0 and master_role is not None:
                # The configured master of a new group: the first epoch is its.
                return await self._elect(conn, cluster, broker_name, member_id, g_epoch, master_role, now, lease)
            if expired:
                winner = await conn.fetchrow(
                    """SELECT member_id FROM ha_member
                       WHERE cluster_name = $1 AND broker_name = $2 AND last_seen > $3
                       ORDER BY max_offset DESC, member_id LIMIT 1""",
                    cluster, broker_name, now - lease,
                )  # fmt: skip
                if winner is not None and winner["member_id"] == member_id:
                    role = group["master_role"] if master_id is not None else (master_role or group["master_role"])
                    return await self._elect(conn, cluster, broker_name, member_id, g_epoch, role, now, lease)
            master = None
            if master_id is not None:
                master = await conn.fetchrow(
                    """SELECT addr, ha_addr FROM ha_member
                       WHERE cluster_name = $1 AND broker_name = $2 AND member_id = $3""",
                    cluster, broker_name, master_id,
                )  # fmt: skip
            return _answer(
                "SLAVE", g_epoch, group["master_role"], lease_s,
                master["addr"] if master and not expired else "", master["ha_addr"] if master and not expired else "",
            )  # fmt: skip

    async def _elect(
        self, conn: Any, cluster: str, broker_name: str, member_id: int, epoch: int, role: str,
        now: dt.datetime, lease: dt.timedelta,
    ) -> dict[str, Any]:  # fmt: skip
        await conn.execute(
            """UPDATE ha_group SET epoch = $3, master_id = $4, master_role = $5, lease_expires_at = $6, changed_at = $7
               WHERE cluster_name = $1 AND broker_name = $2""",
            cluster, broker_name, epoch + 1, member_id, role, now + lease, now,
        )  # fmt: skip
        me = await conn.fetchrow(
            "SELECT addr, ha_addr FROM ha_member WHERE cluster_name = $1 AND broker_name = $2 AND member_id = $3",
            cluster, broker_name, member_id,
        )  # fmt: skip
        return _answer("MASTER", epoch + 1, role, lease.total_seconds(), me["addr"], me["ha_addr"])

    async def groups(self) -> list[dict[str, Any]]:
        """The fleet view: every broker group with its epoch, master and members' lag."""
        async with self.pool.acquire() as conn:
            groups = await conn.fetch("SELECT * FROM ha_group ORDER BY cluster_name, broker_name")
            members = await conn.fetch("SELECT * FROM ha_member ORDER BY cluster_name, broker_name, member_id")
            now: dt.datetime = await conn.fetchval("SELECT now()")
        out = []
        for g in groups:
            key = (g["cluster_name"], g["broker_name"])
            out.append(
                {
                    "cluster": g["cluster_name"],
                    "broker_name": g["broker_name"],
                    "epoch": int(g["epoch"]),
                    "master_id": g["master_id"],
                    "master_role": g["master_role"],
                    "lease_remaining_s": round(max(0.0, (g["lease_expires_at"] - now).total_seconds()), 3),
                    "changed_at": g["changed_at"].isoformat(),
                    "members": [
                        {
                            "member_id": m["member_id"],
                            "addr": m["addr"],
                            "ha_addr": m["ha_addr"],
                            "acting_master": m["acting_master"],
                            "max_offset": int(m["max_offset"]),
                            "lag_bytes": m["lag_bytes"],
                            "seen_s_ago": round((now - m["last_seen"]).total_seconds(), 3),
                        }
                        for m in members
                        if (m["cluster_name"], m["broker_name"]) == key
                    ],
                }
            )
        return out


def _answer(role: str, epoch: int, master_role: str, lease_s: float, addr: str, ha_addr: str) -> dict[str, Any]:
    return {
        "role": role,
        "epoch": epoch,
        "master_role": master_role,
        "lease_s": lease_s,
        "master_addr": addr,
        "master_ha_addr": ha_addr,
    }
