"""Load history: brokers' load reports kept as samples for ``load_history_hours``, read back as
time buckets — a topic's publish rate, a consumer group's consume rate and backlog — summed
across brokers (docs/elasticity.md)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from control_plane.db import Pool, Record
from control_plane.errors import Forbidden
from control_plane.repositories import fleet as fleet_repo
from control_plane.repositories import groups as groups_repo
from control_plane.repositories import load as repo
from control_plane.repositories import tenants as tenants_repo
from control_plane.repositories import topics as topics_repo
from control_plane.services.load_buckets import Bucket, Sample, bucket_starts, bucketize, step_for, totals

log = logging.getLogger(__name__)

MAX_RANGE = dt.timedelta(days=7)
# How far before a range its first bucket's baseline is looked for: an idle item is reported at
# least every load_report_refresh_s (a broker setting, 120 s by default).
LOOKBACK = dt.timedelta(minutes=10)


class LoadService:
    def __init__(self, pool: Pool, *, history_hours: float) -> None:
        self.pool = pool
        self.history = dt.timedelta(hours=history_hours)

    async def ingest(
        self,
        *,
        access_key: str,
        broker: str,
        at: dt.datetime,
        topics: list[dict[str, Any]],
        groups: list[dict[str, Any]],
    ) -> dict[str, int]:
        """Store one report of broker group ``broker``; samples of topics not placed on it (or of
        groups the tenant does not have) are left out and counted as ``ignored``."""
        async with self.pool.acquire() as conn:
            if not await repo.broker_group_exists(conn, broker):
                raise Forbidden(f"{broker!r} is not a broker group of this control plane", broker_group=broker)
            bound = await repo.bound_group(conn, access_key)
            if bound is not None and bound != broker:
                raise Forbidden(
                    f"this credential speaks for broker group {bound!r}, not {broker!r}", broker_group=bound
                )
            async with conn.transaction():
                stored = await repo.insert_topic_samples(conn, broker=broker, at=at, topics=topics)
                stored += await repo.insert_group_samples(conn, broker=broker, at=at, groups=groups)
        return {"stored": stored, "ignored": len(topics) + len(groups) - stored}

    async def topic_load(self, *, tenant_id: str, topic: str, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
        step = step_for(end - start)
        starts = bucket_starts(start, end, step)
        async with self.pool.acquire() as conn:
            await tenants_repo.get_tenant(conn, tenant_id=tenant_id)
            await topics_repo.require_topic(conn, tenant_id=tenant_id, name=topic)
            rows = await repo.topic_samples(conn, tenant_id=tenant_id, topic=topic, start=starts[0] - LOOKBACK, end=end)
        return {
            "tenant_id": tenant_id,
            "topic": topic,
            **_range(start, end, step),
            "buckets": _publish_buckets([r["broker"] for r in rows], rows, starts, step),
        }

    async def broker_group_load(self, *, group: str, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
        """A broker group's publish rate and refusals over time, summed over the tenant topics it
        reported (what the autoscaler weighs against its ``max_msgs_per_s`` to call it hot)."""
        step = step_for(end - start)
        starts = bucket_starts(start, end, step)
        async with self.pool.acquire() as conn:
            g = await fleet_repo.get_broker_group(conn, group)
            rows = await repo.broker_group_samples(conn, broker=group, start=starts[0] - LOOKBACK, end=end)
        # one series per topic: a report may leave out a topic whose figures did not change
        keys = [f"{r['tenant_id']}\x00{r['topic']}" for r in rows]
        return {
            "broker_group": group,
            "max_msgs_per_s": int(g["max_msgs_per_s"]),
            "topics": len(set(keys)),
            **_range(start, end, step),
            "buckets": _publish_buckets(keys, rows, starts, step),
        }

    async def group_lag(
        self, *, tenant_id: str, group: str, topic: str | None, start: dt.datetime, end: dt.datetime
    ) -> dict[str, Any]:
        step = step_for(end - start)
        starts = bucket_starts(start, end, step)
        async with self.pool.acquire() as conn:
            await tenants_repo.get_tenant(conn, tenant_id=tenant_id)
            await groups_repo.require_group(conn, tenant_id=tenant_id, name=group)
            if topic is not None:
                await topics_repo.require_topic(conn, tenant_id=tenant_id, name=topic)
            rows = await repo.group_samples(
                conn, tenant_id=tenant_id, group=group, topic=topic, start=starts[0] - LOOKBACK, end=end
            )
        # one series per broker and topic: a report may leave out a topic whose figures did not change
        samples = [Sample(f"{r['broker']}\x00{r['topic']}", r["at"], r["committed"], r["backlog"]) for r in rows]
        return {
            "tenant_id": tenant_id,
            "group": group,
            "topic": topic,
            **_range(start, end, step),
            "buckets": [
                {"start": b.start.isoformat(), "consume_rate": _rate(b), "backlog": b.gauge}
                for b in bucketize(samples, starts, step)
            ],
        }

    async def prune(self, *, now: dt.datetime | None = None) -> int:
        before = (now or dt.datetime.now(dt.UTC)) - self.history
        async with self.pool.acquire() as conn:
            return await repo.prune(conn, before=before)

    async def prune_every(self, interval_s: float) -> None:
        """Prune, then again every ``interval_s``, until cancelled (a failed round is logged)."""
        while True:
            try:
                pruned = await self.prune()
                if pruned:
                    log.info("pruned %d load samples older than %s", pruned, self.history)
            except Exception:
                log.exception("pruning load samples failed")
            await asyncio.sleep(interval_s)


def _range(start: dt.datetime, end: dt.datetime, step: dt.timedelta) -> dict[str, Any]:
    return {"from": start.isoformat(), "to": end.isoformat(), "step_s": int(step.total_seconds())}


def _publish_buckets(
    series: list[str], rows: list[Record], starts: list[dt.datetime], step: dt.timedelta
) -> list[dict[str, Any]]:
    """Publish rate and refusals a bucket from topic samples, ``series[i]`` naming ``rows[i]``'s."""
    appended = bucketize([Sample(k, r["at"], r["appended"]) for k, r in zip(series, rows, strict=True)], starts, step)
    refused = totals([Sample(k, r["at"], 0, r["refused"]) for k, r in zip(series, rows, strict=True)], starts, step)
    return [
        {"start": a.start.isoformat(), "publish_rate": _rate(a), "refused": r}
        for a, r in zip(appended, refused, strict=True)
    ]


def _rate(b: Bucket) -> float | None:
    return None if b.rate is None else round(b.rate, 3)
