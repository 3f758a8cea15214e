"""Topics: idempotent creation with placement, plan limits, changes and deletion.

Creating a topic writes the topic (status ``provisioning``) and all its placements in ONE
transaction, under a lock on the tenant row (plan limits and idempotency) and on the active
broker groups (free capacity). A crash before the commit leaves nothing; after it, the
reconciler finds the topic in ``desired_state`` and calls ``mark_topic_active`` once every broker
group has it. Sending the same request again answers the same topic; another spec under the
same name is a conflict.

Retention is in two tiers: ``retention_hours``, the total (1..``MAX_RETENTION_HOURS``, or
"unlimited" on a plan with ``unlimited_retention``; stored as NULL), and
``local_retention_hours``, how long brokers keep the messages on their own disks as well before
only object storage has them (NULL: the broker's default; at most a finite total).
"""

from __future__ import annotations

import enum
import logging
from typing import Any, Literal

from control_plane import placement
from control_plane.db import Connection, Pool, Record
from control_plane.errors import InvalidField, QuotaExceeded, TenantSuspended, TopicExists
from control_plane.repositories import fleet as fleet_repo
from control_plane.repositories import jsonable
from control_plane.repositories import plans as plans_repo
from control_plane.repositories import scaling as scaling_repo
from control_plane.repositories import tenants as tenants_repo
from control_plane.repositories import topics as repo
from data_plane.tenancy.namespace import wire_name

log = logging.getLogger(__name__)
MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION")
DEFAULT_RETENTION_HOURS = 72
MAX_RETENTION_HOURS = 8760  # a year, for the total and the local retention alike
UNLIMITED: Literal["unlimited"] = "unlimited"
Retention = int | Literal["unlimited"]  # as the API takes and shows retention_hours


class Unchanged(enum.Enum):
    UNCHANGED = "unchanged"


UNCHANGED = Unchanged.UNCHANGED  # a PATCH field left out


def _stored(retention: Retention) -> int | None:
    """retention_hours as its column holds it: NULL for unlimited."""
    return None if retention == UNLIMITED else retention


def _check_local(retention: int | None, local: int | None) -> None:
    """The local copy is part of the total: ``local`` within ``retention`` (None: unlimited)."""
    if local is not None and retention is not None and local > retention:
        raise InvalidField(
            "local_retention_hours",
            f"must be at most retention_hours ({retention}): the local copy is part of the total "
            "(lower it too, or set it to null for the broker's default)",
        )


def _check_plan(limits: plans_repo.Limits, retention: int | None) -> None:
    """``retention`` (None: unlimited) within what the tenant's plan allows."""
    if retention is None and not limits["unlimited_retention"]:
        raise QuotaExceeded(
            "unlimited_retention",
            allowed=False,
            requested=True,
            message=f'retention_hours "{UNLIMITED}" needs a plan with unlimited_retention; this tenant\'s plan '
            f"keeps messages at most {limits['max_retention_hours']} hours",
        )
    if retention is not None and retention > limits["max_retention_hours"]:
        raise QuotaExceeded("max_retention_hours", allowed=limits["max_retention_hours"], requested=retention)


def _spec(row: Record) -> dict[str, Any]:
    """A topic row as the API shows it: retention_hours "unlimited" for NULL."""
    out = jsonable(row)
    if out["retention_hours"] is None:
        out["retention_hours"] = UNLIMITED
    return out


def _topic(row: Record, placements: list[Record]) -> dict[str, Any]:
    out = _spec(row)
    out["wire_name"] = wire_name(row["tenant_id"], row["name"])
    out["placements"] = [jsonable(p, drop=("topic",)) for p in placements]
    return out


async def _lock_active_tenant(conn: Connection, tenant_id: str) -> None:
    tenant = await tenants_repo.get_tenant(conn, tenant_id=tenant_id, for_update=True)
    if tenant["status"] != "active":
        raise TenantSuspended(f"tenant {tenant_id!r} is suspended", tenant=tenant_id)


async def _place(conn: Connection, *, tenant_id: str, topic: str, queues: int) -> None:
    groups = [
        placement.GroupCapacity(r["name"], int(r["max_queues"]), int(r["placed_queues"]))
        for r in await fleet_repo.lock_active_groups(conn)
    ]
    spread = placement.spread(queues, groups)
    await repo.add_placements(conn, tenant_id=tenant_id, topic=topic, queues_by_group=spread)


def _queues_within_plan(wanted: int, *, used: int, limit: int) -> int:
    allowed = min(wanted, limit - used)
    if allowed < 1:
        raise QuotaExceeded("max_queues", allowed=limit, requested=used + wanted)
    return allowed


class TopicService:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def create(
        self,
        *,
        tenant_id: str,
        name: str,
        message_type: str,
        retention_hours: Retention | None,
        local_retention_hours: int | None,
        throughput_hint_msgs_per_s: int | None,
        description: str,
    ) -> tuple[dict[str, Any], bool]:
        """The topic and whether this call created it. ``retention_hours`` None: min(72, the
        plan's max_retention_hours)."""
        async with self.pool.acquire() as conn, conn.transaction():
            await _lock_active_tenant(conn, tenant_id)
            limits = await plans_repo.effective_limits(conn, tenant_id=tenant_id)
            retention = (
                min(DEFAULT_RETENTION_HOURS, limits["max_retention_hours"])
                if retention_hours is None
                else _stored(retention_hours)
            )
            _check_local(retention, local_retention_hours)
            existing = await repo.get_topic(conn, tenant_id=tenant_id, name=name)
            if existing is not None:
                asked = (message_type, retention, local_retention_hours, throughput_hint_msgs_per_s, description)
                have = tuple(
                    existing[k]
                    for k in (
                        "message_type",
                        "retention_hours",
                        "local_retention_hours",
                        "throughput_hint_msgs_per_s",
                        "description",
                    )
                )
                if asked != have:
                    raise TopicExists(
                        f"topic {name!r} exists with another spec",
                        tenant=tenant_id,
                        topic=name,
                        existing=_spec(existing),
                    )
                return _topic(existing, await repo.placements_of(conn, tenant_id=tenant_id, topic=name)), False
            _check_plan(limits, retention)
            topics, queues = await repo.count_topics_and_queues(conn, tenant_id=tenant_id)
            if topics + 1 > limits["max_topics"]:
                raise QuotaExceeded("max_topics", allowed=limits["max_topics"], requested=topics + 1)
            queue_count = _queues_within_plan(
                placement.queue_count_for(throughput_hint_msgs_per_s), used=queues, limit=limits["max_queues"]
            )
            row = await repo.insert_topic(
                conn,
                tenant_id=tenant_id,
                name=name,
                message_type=message_type,
                retention_hours=retention,
                local_retention_hours=local_retention_hours,
                throughput_hint_msgs_per_s=throughput_hint_msgs_per_s,
                queue_count=queue_count,
                description=description,
            )
            await _place(conn, tenant_id=tenant_id, topic=name, queues=queue_count)
            placements = await repo.placements_of(conn, tenant_id=tenant_id, topic=name)
        log.info("topic %s%%%s created with %d queues", tenant_id, name, queue_count)
        return _topic(row, placements), True

    async def get(self, *, tenant_id: str, name: str) -> dict[str, Any]:
        async with self.pool.acquire() as conn:
            await tenants_repo.get_tenant(conn, tenant_id=tenant_id)
            row = await repo.require_topic(conn, tenant_id=tenant_id, name=name)
            return _topic(row, await repo.placements_of(conn, tenant_id=tenant_id, topic=name))

    async def scaling_events(self, *, tenant_id: str, name: str) -> list[dict[str, Any]]:
        async with self.pool.acquire() as conn:
            await repo.require_topic(conn, tenant_id=tenant_id, name=name)
            return [jsonable(r) for r in await scaling_repo.list_events(conn, tenant_id=tenant_id, topic=name)]

    async def list_topics(self, *, tenant_id: str) -> list[dict[str, Any]]:
        async with self.pool.acquire() as conn:
            await tenants_repo.get_tenant(conn, tenant_id=tenant_id)
            placements = await repo.placements_by_topic(conn, tenant_id=tenant_id)
            return [_topic(r, placements.get(r["name"], [])) for r in await repo.list_topics(conn, tenant_id=tenant_id)]

    async def update(
        self,
        *,
        tenant_id: str,
        name: str,
        retention_hours: Retention | None,
        local_retention_hours: int | Unchanged | None,
        throughput_hint_msgs_per_s: int | None,
        description: str | None,
    ) -> dict[str, Any]:
        """Change retention, local retention, the throughput hint or the description (None and
        ``UNCHANGED``: unchanged; ``local_retention_hours`` None: back to the broker's default).
        A larger hint adds writable queues (placed like new ones; a group's read-only ones take
        messages again first); the autoscaler, not the hint, takes queues away."""
        async with self.pool.acquire() as conn, conn.transaction():
            await _lock_active_tenant(conn, tenant_id)
            row = await repo.require_topic(conn, tenant_id=tenant_id, name=name, for_update=True)
            limits = await plans_repo.effective_limits(conn, tenant_id=tenant_id)
            retention = row["retention_hours"] if retention_hours is None else _stored(retention_hours)
            local = row["local_retention_hours"] if local_retention_hours is UNCHANGED else local_retention_hours
            _check_local(retention, local)
            _check_plan(limits, retention)
            hint = (
                row["throughput_hint_msgs_per_s"] if throughput_hint_msgs_per_s is None else throughput_hint_msgs_per_s
            )
            queue_count, status = int(row["queue_count"]), str(row["status"])
            writable = sum(int(p["write_queue_count"]) for p in await repo.placements_of(conn, tenant_id=tenant_id,
                                                                                          topic=name))  # fmt: skip
            extra = placement.queue_count_for(hint) - writable
            if extra > 0:
                _topics, used = await repo.count_topics_and_queues(conn, tenant_id=tenant_id)
                extra = _queues_within_plan(extra, used=used, limit=limits["max_queues"])
                await _place(conn, tenant_id=tenant_id, topic=name, queues=extra)
                queue_count = int((await repo.require_topic(conn, tenant_id=tenant_id, name=name))["queue_count"])
                status = "provisioning"
            row = await repo.update_topic(
                conn,
                tenant_id=tenant_id,
                name=name,
                retention_hours=retention,
                local_retention_hours=local,
                throughput_hint_msgs_per_s=hint,
                queue_count=queue_count,
                description=row["description"] if description is None else description,
                status=status,
            )
            return _topic(row, await repo.placements_of(conn, tenant_id=tenant_id, topic=name))

    async def delete(self, *, tenant_id: str, name: str) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await tenants_repo.get_tenant(conn, tenant_id=tenant_id)
            await repo.delete_topic(conn, tenant_id=tenant_id, name=name)
        log.info("topic %s%%%s deleted", tenant_id, name)

    async def mark_active(self, *, tenant_id: str, name: str, broker_group: str | None = None) -> str:
        """Called by the reconciler once ``broker_group`` (every group, when None) has the topic;
        the topic is ``active`` once all its placements are applied. Returns its status."""
        async with self.pool.acquire() as conn, conn.transaction():
            return await repo.mark_applied(conn, tenant_id=tenant_id, topic=name, broker_group=broker_group)
