"""Load samples from brokers' load reports (``topic_load_samples``, ``group_load_samples``).

A sample is stored only for a topic placed on the reporting broker group (and, for a group
sample, a consumer group of the topic's tenant): a broker speaks for its own group's topics only.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from control_plane.db import Connection, Record


def _count(status: str) -> int:
    return int(status.rsplit(" ", 1)[-1])


async def broker_group_exists(conn: Connection, name: str) -> bool:
    return bool(await conn.fetchval("SELECT 1 FROM broker_groups WHERE name = $1", name))


async def bound_group(conn: Connection, access_key: str) -> str | None:
    """The broker group a host-bound broker credential speaks for (None: not bound to a host)."""
    value = await conn.fetchval("SELECT broker_group FROM broker_host_credentials WHERE access_key = $1", access_key)
    return None if value is None else str(value)


async def insert_topic_samples(conn: Connection, *, broker: str, at: dt.datetime, topics: list[dict[str, Any]]) -> int:
    status = await conn.execute(
        """INSERT INTO topic_load_samples (tenant_id, topic, broker, at, appended, queues, refused)
           SELECT u.tenant, u.topic, $1, $2, u.appended, u.queues, u.refused
           FROM unnest($3::text[], $4::text[], $5::bigint[], $6::int[], $7::bigint[])
                AS u (tenant, topic, appended, queues, refused)
           JOIN topic_placements p ON p.tenant_id = u.tenant AND p.topic = u.topic AND p.broker_group = $1
           ON CONFLICT DO NOTHING""",
        broker,
        at,
        [t["tenant"] for t in topics],
        [t["topic"] for t in topics],
        [t["appended"] for t in topics],
        [t["queues"] for t in topics],
        [t["refused"] for t in topics],
    )
    return _count(status)


async def insert_group_samples(conn: Connection, *, broker: str, at: dt.datetime, groups: list[dict[str, Any]]) -> int:
    status = await conn.execute(
        """INSERT INTO group_load_samples (tenant_id, consumer_group, topic, broker, at, committed, backlog)
           SELECT u.tenant, u.grp, u.topic, $1, $2, u.committed, u.backlog
           FROM unnest($3::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[])
                AS u (tenant, grp, topic, committed, backlog)
           JOIN topic_placements p ON p.tenant_id = u.tenant AND p.topic = u.topic AND p.broker_group = $1
           JOIN consumer_groups g ON g.tenant_id = u.tenant AND g.name = u.grp
           ON CONFLICT DO NOTHING""",
        broker,
        at,
        [g["tenant"] for g in groups],
        [g["group"] for g in groups],
        [g["topic"] for g in groups],
        [g["committed"] for g in groups],
        [g["backlog"] for g in groups],
    )
    return _count(status)


async def topic_samples(
    conn: Connection, *, tenant_id: str, topic: str, start: dt.datetime, end: dt.datetime
) -> list[Record]:
    return await conn.fetch(
        """SELECT broker, at, appended, refused FROM topic_load_samples
           WHERE tenant_id = $1 AND topic = $2 AND at >= $3 AND at < $4""",
        tenant_id,
        topic,
        start,
        end,
    )


async def broker_group_samples(conn: Connection, *, broker: str, start: dt.datetime, end: dt.datetime) -> list[Record]:
    """Every tenant topic's samples that broker group ``broker`` reported."""
    return await conn.fetch(
        """SELECT tenant_id, topic, at, appended, refused FROM topic_load_samples
           WHERE broker = $1 AND at >= $2 AND at < $3""",
        broker,
        start,
        end,
    )


async def group_samples(
    conn: Connection, *, tenant_id: str, group: str, topic: str | None, start: dt.datetime, end: dt.datetime
) -> list[Record]:
    """The group's samples on ``topic`` (None: on every topic)."""
    return await conn.fetch(
        """SELECT broker, topic, at, committed, backlog FROM group_load_samples
           WHERE tenant_id = $1 AND consumer_group = $2 AND ($3::text IS NULL OR topic = $3)
             AND at >= $4 AND at < $5""",
        tenant_id,
        group,
        topic,
        start,
        end,
    )


async def prune(conn: Connection, *, before: dt.datetime) -> int:
    """Delete the samples taken before ``before``; how many."""
    topics = _count(await conn.execute("DELETE FROM topic_load_samples WHERE at < $1", before))
    groups = _count(await conn.execute("DELETE FROM group_load_samples WHERE at < $1", before))
    return topics + groups
