"""HaService: the leases behind automatic failover (docs/ha.md#failover).

Every process of a broker group's members calls ``heartbeat`` every ``failover_check_interval_s``
with what it knows of itself. In one transaction, the group's row locked (``SELECT ... FOR
UPDATE``), so two members never both win:

- A member **hears** the control plane when its heartbeat echoes the sequence number of the last
  answer sent to its process (``heard``). A member that does not hear (its answers are lost on
  the way back: an asymmetric cut) is neither renewed nor elected: electing it would hand the
  group to a member that cannot learn it won.
- The lease belongs to one process (``instance``) of the master member; it is renewed while
  that process hears. A master that fenced itself on its own clock has, by construction, missed
  the answers: its heartbeats renew nothing and its lease lapses. Each answer to the master says
  how much of the lease is left, so it never writes past the lease kept here.
- Once the lease has run out, a member is elected master under epoch + 1 from the candidates:
  live (heard from within ``lease_s``), hearing, and in the **in-sync set** — the members that
  hold every acknowledged message, as the master reports them each heartbeat (just the winner
  right after an election; NULL for a group that never reported: everyone). Candidates are
  ordered by the epoch of the log they hold (``log_epoch``: the epoch of the master their log
  last followed), then by how far it reaches, then by the lowest id. A candidate that has not
  reported since the lease ran out is waited for a short grace (its offset may have moved on).
- A master that every member probing it (live, hearing, of its epoch) has failed to reach on
  its client address for over two check intervals is asked to step down: an answer naming no
  master, on which it fences. Once its next heartbeat echoes that answer, its lease is released
  and the others elect at once (it is no candidate while they cannot reach it).
- A new group waits ``lease_s`` for its configured master (member 0) before electing anyone.
- A second process for a member already heard from recently is refused (409): one member id,
  one process. A broker credential bound to one host of a broker group (``broker_host_credentials``)
  heartbeats only for that group, from that host (403 otherwise).
- Everyone else is told the epoch and the master's addresses, and follows.

Every election is kept in ``ha_epoch`` (the fleet view shows the latest).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from control_plane.db import Pool
from control_plane.errors import Forbidden, MemberRunsElsewhere
from control_plane.services.fleet import host_of

ROLES = ("SYNC_MASTER", "ASYNC_MASTER")
HISTORY_SHOWN = 20  # elections per group in the fleet view
HISTORY_KEPT = 1000  # elections per group kept
UNREACHABLE_MARGIN_S = 0.5  # a master is unreachable once probes failed for 2 check intervals and this


@dataclass(frozen=True, slots=True)
class Heartbeat:
    cluster: str
    broker_name: str
    member_id: int
    addr: str
    ha_addr: str
    max_offset: int
    epoch: int
    acting_master: bool
    master_role: str | None
    lag_bytes: int | None
    lease_s: float
    instance: str = ""
    heard: int = 0  # the seq of the last answer this process took (0: none yet)
    log_epoch: int = 0
    in_sync: tuple[int, ...] | None = None  # a master's slaves holding every acknowledged message
    interval_s: float = 1.0
    access_key: str = ""  # the caller's credential: one bound to a host speaks for that host only
    master_unreachable_s: float | None = None  # a slave's probes of its master's client address failing this long


class HaService:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def heartbeat(self, beat: Heartbeat) -> dict[str, Any]:
        lease = dt.timedelta(seconds=beat.lease_s)
        cluster, name, member = beat.cluster, beat.broker_name, beat.member_id
        async with self.pool.acquire() as conn, conn.transaction():
            bound = await conn.fetchrow(
                "SELECT broker_group, host FROM broker_host_credentials WHERE access_key = $1", beat.access_key
            )
            if bound is not None and (bound["broker_group"] != name or host_of(beat.addr) != bound["host"]):
                raise Forbidden(
                    f"this credential is bound to host {bound['host']} of broker group {bound['broker_group']}",
                    broker_group=bound["broker_group"],
                )
            now: dt.datetime = await conn.fetchval("SELECT now()")
            await conn.execute(
                """INSERT INTO ha_group (cluster_name, broker_name, lease_expires_at, master_role)
                   VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING""",
                cluster, name, now + lease, beat.master_role or "SYNC_MASTER",
            )  # fmt: skip
            group = await conn.fetchrow(
                "SELECT * FROM ha_group WHERE cluster_name = $1 AND broker_name = $2 FOR UPDATE", cluster, name
            )
            assert group is not None
            prev = await conn.fetchrow(
                """SELECT instance, answers, last_seen, interval_s FROM ha_member
                   WHERE cluster_name = $1 AND broker_name = $2 AND member_id = $3""",
                cluster, name, member,
            )  # fmt: skip
            if prev is not None and prev["instance"] and prev["instance"] != beat.instance:
                quiet = (now - prev["last_seen"]).total_seconds()
                if quiet < 2 * float(prev["interval_s"]):
                    raise MemberRunsElsewhere(
                        f"member {member} of {name} already runs as another process, heard {quiet:.1f} s ago",
                        member_id=member,
                    )
            answers = 0 if prev is None or prev["instance"] != beat.instance else int(prev["answers"])
            # A heartbeat naming no process (a broker that does not echo answers) is taken as heard.
            hearing = not beat.instance or beat.heard == answers
            seq = answers + 1
            await conn.execute(
                """INSERT INTO ha_member AS m (cluster_name, broker_name, member_id, addr, ha_addr, max_offset, epoch,
                                               acting_master, lag_bytes, last_seen, instance, answers, hearing,
                                               log_epoch, interval_s, master_unreachable_s)
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
                   ON CONFLICT (cluster_name, broker_name, member_id) DO UPDATE
                   SET addr = $4, ha_addr = $5, max_offset = $6, epoch = $7, acting_master = $8, lag_bytes = $9,
                       last_seen = $10, instance = $11, answers = $12, hearing = $13, log_epoch = $14,
                       interval_s = $15, master_unreachable_s = $16""",
                cluster, name, member, beat.addr, beat.ha_addr, beat.max_offset, beat.epoch, beat.acting_master,
                beat.lag_bytes, now, beat.instance, seq, hearing, beat.log_epoch, beat.interval_s,
                beat.master_unreachable_s,
            )  # fmt: skip
            g_epoch = int(group["epoch"])
            master_id = group["master_id"]
            expires: dt.datetime = group["lease_expires_at"]
            expired = expires <= now
            holder = master_id == member and group["master_instance"] == beat.instance
            release_seq = int(group["release_seq"])
            if holder and not expired and release_seq and beat.heard >= release_seq:
                # It heard the answer asking it to step down, and fenced on it: the lease is free.
                expires, expired = now, True
                await conn.execute(
                    """UPDATE ha_group SET lease_expires_at = $3, release_seq = 0
                       WHERE cluster_name = $1 AND broker_name = $2""",
                    cluster, name, now,
                )  # fmt: skip
            if holder and not expired and (release_seq or await self._unreachable(conn, group, now, lease)):
                # The other members cannot reach it on its client address: no renewal, and an
                # answer naming no master (it fences on hearing it).
                if not release_seq:
                    await conn.execute(
                        "UPDATE ha_group SET release_seq = $3 WHERE cluster_name = $1 AND broker_name = $2",
                        cluster, name, seq,
                    )  # fmt: skip
                return _answer("SLAVE", g_epoch, group["master_role"], beat, seq, "", "")
            if holder and not expired:
                if hearing:
                    expires = now + lease
                    sync_set = group["sync_set"]
                    if beat.in_sync is not None and beat.epoch == g_epoch:
                        sync_set = sorted({member, *beat.in_sync})
                    await conn.execute(
                        """UPDATE ha_group SET lease_expires_at = $3, sync_set = $4
                           WHERE cluster_name = $1 AND broker_name = $2""",
                        cluster, name, expires, sync_set,
                    )  # fmt: skip
                    group = {**group, "sync_set": sync_set}
                return _answer(
                    "MASTER", g_epoch, group["master_role"], beat, seq, beat.addr, beat.ha_addr,
                    remaining_s=(expires - now).total_seconds(), sync_set=group["sync_set"],
                )  # fmt: skip
            if master_id is None and not expired and member == 0 and beat.master_role is not None and hearing:
                # The configured master of a new group: the first epoch is its.
                return await self._elect(conn, group, beat, beat.master_role, now, lease, seq)
            if expired and hearing and await self._wins(conn, group, beat, now, lease):
                role = group["master_role"] if master_id is not None else (beat.master_role or group["master_role"])
                return await self._elect(conn, group, beat, role, now, lease, seq)
            master = None
            if master_id is not None and master_id != member and not expired:
                master = await conn.fetchrow(
                    """SELECT addr, ha_addr FROM ha_member
                       WHERE cluster_name = $1 AND broker_name = $2 AND member_id = $3""",
                    cluster, name, master_id,
                )  # fmt: skip
            return _answer(
                "SLAVE", g_epoch, group["master_role"], beat, seq,
                master["addr"] if master else "", master["ha_addr"] if master else "",
            )  # fmt: skip

    async def _unreachable(self, conn: Any, group: Any, now: dt.datetime, lease: dt.timedelta) -> bool:
        """Whether the members that probe the master's client address (live, hearing, of its
        epoch) all find it unreachable, for over two of their check intervals — clients cannot
        reach it either, so it should hand the group over — and one of them could take it (is in
        the in-sync set): a step-down with no successor would only stop writes."""
        rows = await conn.fetch(
            """SELECT member_id, master_unreachable_s, interval_s FROM ha_member
               WHERE cluster_name = $1 AND broker_name = $2 AND member_id <> $3 AND last_seen > $4 AND hearing
                 AND epoch = $5 AND master_unreachable_s IS NOT NULL""",
            group["cluster_name"], group["broker_name"], group["master_id"], now - lease, group["epoch"],
        )  # fmt: skip
        sync_set = group["sync_set"]
        successor = any(sync_set is None or r["member_id"] in sync_set for r in rows)
        return successor and all(
            float(r["master_unreachable_s"]) > 2 * float(r["interval_s"]) + UNREACHABLE_MARGIN_S for r in rows
        )

    async def _wins(
        self, conn: Any, group: Any, beat: Heartbeat, now: dt.datetime, lease: dt.timedelta
    ) -> bool:  # fmt: skip
        """Whether the caller (hearing) is the best candidate of an election held now."""
        sync_set = group["sync_set"]
        if sync_set is not None and beat.member_id not in sync_set:
            return False
        rows = await conn.fetch(
            """SELECT member_id, log_epoch, max_offset, last_seen FROM ha_member
               WHERE cluster_name = $1 AND broker_name = $2 AND last_seen > $3 AND hearing
                 AND ($4::integer[] IS NULL OR member_id = ANY($4::integer[]))""",
            beat.cluster, beat.broker_name, now - lease, sync_set,
        )  # fmt: skip
        if group["master_id"] is not None and await self._unreachable(conn, group, now, lease):
            rows = [r for r in rows if r["member_id"] != group["master_id"]]  # clients cannot reach it
        if not rows:
            return False
        best = max(rows, key=lambda r: (int(r["log_epoch"]), int(r["max_offset"]), -int(r["member_id"])))
        if best["member_id"] != beat.member_id:
            return False
        # A candidate last heard before the lease ran out may since have received more: wait a
        # moment for it to report (it would be compared on what it has now).
        grace = dt.timedelta(seconds=min(beat.lease_s / 2, 2 * beat.interval_s))
        expired_at: dt.datetime = group["lease_expires_at"]
        stale = [r for r in rows if r["member_id"] != beat.member_id and r["last_seen"] < expired_at]
        return not stale or now >= expired_at + grace

    async def _elect(
        self, conn: Any, group: Any, beat: Heartbeat, role: str, now: dt.datetime, lease: dt.timedelta, seq: int,
    ) -> dict[str, Any]:  # fmt: skip
        epoch = int(group["epoch"]) + 1
        cluster, name = beat.cluster, beat.broker_name
        await conn.execute(
            """UPDATE ha_group SET epoch = $3, master_id = $4, master_role = $5, lease_expires_at = $6,
                                   changed_at = $7, master_instance = $8, sync_set = $9, release_seq = 0
               WHERE cluster_name = $1 AND broker_name = $2""",
            cluster, name, epoch, beat.member_id, role, now + lease, now, beat.instance, [beat.member_id],
        )  # fmt: skip
        await conn.execute(
            """INSERT INTO ha_epoch (cluster_name, broker_name, epoch, master_id, log_epoch, max_offset, elected_at)
               VALUES ($1, $2, $3, $4, $5, $6, $7)""",
            cluster, name, epoch, beat.member_id, beat.log_epoch, beat.max_offset, now,
        )  # fmt: skip
        await conn.execute(
            "DELETE FROM ha_epoch WHERE cluster_name = $1 AND broker_name = $2 AND epoch <= $3",
            cluster, name, epoch - HISTORY_KEPT,
        )  # fmt: skip
        return _answer(
            "MASTER", epoch, role, beat, seq, beat.addr, beat.ha_addr,
            remaining_s=lease.total_seconds(), sync_set=[beat.member_id],
        )  # fmt: skip

    async def groups(self) -> list[dict[str, Any]]:
        """The fleet view: every broker group with its epoch, master, in-sync set, members' lag
        and latest elections."""
        async with self.pool.acquire() as conn:
            groups = await conn.fetch("SELECT * FROM ha_group ORDER BY cluster_name, broker_name")
            members = await conn.fetch("SELECT * FROM ha_member ORDER BY cluster_name, broker_name, member_id")
            history = await conn.fetch(
                """SELECT * FROM (
                       SELECT *, row_number() OVER (PARTITION BY cluster_name, broker_name ORDER BY epoch DESC) AS n
                       FROM ha_epoch) h
                   WHERE n <= $1 ORDER BY cluster_name, broker_name, epoch""",
                HISTORY_SHOWN,
            )
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
                    "sync_set": list(g["sync_set"]) if g["sync_set"] is not None else None,
                    "members": [
                        {
                            "member_id": m["member_id"],
                            "addr": m["addr"],
                            "ha_addr": m["ha_addr"],
                            "acting_master": m["acting_master"],
                            "hearing": m["hearing"],
                            "max_offset": int(m["max_offset"]),
                            "epoch": int(m["epoch"]),
                            "log_epoch": int(m["log_epoch"]),
                            "lag_bytes": m["lag_bytes"],
                            "seen_s_ago": round((now - m["last_seen"]).total_seconds(), 3),
                        }
                        for m in members
                        if (m["cluster_name"], m["broker_name"]) == key
                    ],
                    "history": [
                        {
                            "epoch": int(h["epoch"]),
                            "master_id": h["master_id"],
                            "log_epoch": int(h["log_epoch"]),
                            "max_offset": int(h["max_offset"]),
                            "elected_at": h["elected_at"].isoformat(),
                        }
                        for h in history
                        if (h["cluster_name"], h["broker_name"]) == key
                    ],
                }
            )
        return out


def _answer(
    role: str, epoch: int, master_role: str, beat: Heartbeat, seq: int, addr: str, ha_addr: str,
    *, remaining_s: float | None = None, sync_set: list[int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = {
        "role": role,
        "epoch": epoch,
        "master_role": master_role,
        "lease_s": beat.lease_s,
        "master_addr": addr,
        "master_ha_addr": ha_addr,
        "seq": seq,
    }
    if remaining_s is not None:  # to the master: what is left of its lease, and its in-sync set
        out["lease_remaining_s"] = round(max(0.0, remaining_s), 3)
        out["sync_set"] = sync_set
    return out
