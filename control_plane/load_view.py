"""Publish rates from the brokers' load reports (``topic_load_samples``): the autoscaler's view.

A topic's rate on a broker is the growth of ``appended`` (the sum of its queues' max offsets)
over the window, divided by the window: from its last report before the window (a broker reports
an unchanged topic only now and then, so that report may be old, and the growth since then
happened in the window or one report interval before it) through its reports in the window. A
topic reported within the last hour but not in the window has not changed: its rate is 0. A
queue taken away or given back changes ``appended`` by its offsets, not by messages: a pair of
reports with different queue counts adds no growth. A topic's rate is the sum over its brokers,
a broker group's the sum over its topics."""

from __future__ import annotations

import datetime as dt
import itertools
from collections import defaultdict

from control_plane.db import Pool

Key = tuple[str, str]
BASELINE = dt.timedelta(hours=1)  # how far back a topic's last report counts


class SampledLoad:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def _per_broker(self, window_s: float) -> dict[tuple[str, str, str], float]:
        since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=window_s)
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                """SELECT tenant_id, topic, broker, at, appended, queues FROM topic_load_samples WHERE at >= $1
                   UNION ALL
                   SELECT * FROM (SELECT DISTINCT ON (tenant_id, topic, broker)
                                         tenant_id, topic, broker, at, appended, queues
                                  FROM topic_load_samples WHERE at < $1 AND at >= $2
                                  ORDER BY tenant_id, topic, broker, at DESC) AS baseline
                   ORDER BY tenant_id, topic, broker, at""",
                since,
                since - BASELINE,
            )
        series: dict[tuple[str, str, str], list[tuple[dt.datetime, int, int]]] = defaultdict(list)
        for r in rows:
            series[(r["tenant_id"], r["topic"], r["broker"])].append((r["at"], int(r["appended"]), int(r["queues"])))
        out: dict[tuple[str, str, str], float] = {}
        for key, points in series.items():
            grown = sum(max(0, b[1] - a[1]) for a, b in itertools.pairwise(points) if a[2] == b[2])
            out[key] = grown / window_s
        return out

    async def rates(self, window_s: float) -> tuple[dict[Key, float], dict[str, float]]:
        """Publish msgs/s over the window by topic, and by broker group (one read of the samples)."""
        topics: dict[Key, float] = defaultdict(float)
        groups: dict[str, float] = defaultdict(float)
        for (tenant, topic, broker), rate in (await self._per_broker(window_s)).items():
            topics[(tenant, topic)] += rate
            groups[broker] += rate
        return dict(topics), dict(groups)
