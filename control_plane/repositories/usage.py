"""Usage records reported by brokers, and their aggregation per minute or hour.

Counters (requests in 4 KiB units, bytes in and out, messages deleted inside their retention at a
broker's emergency watermark, messages published and consumed, throttled requests) add up;
``stored_bytes`` (on brokers' disks) and ``tiered_bytes`` (in object storage only) are gauges: per
broker and minute the largest report counts, brokers add up, and an hour shows its peak minute.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from control_plane.db import Connection, Record


async def insert_records(conn: Connection, records: list[dict[str, Any]]) -> int:
    """Insert what is new; returns how many were (a resent report_id counts nothing)."""
    inserted = 0
    for r in records:
        done = await conn.execute(
            """INSERT INTO usage_records (report_id, broker, tenant_id, minute, requests_4k, bytes_in, bytes_out,
                                          stored_bytes, forced_deleted_messages, tiered_bytes, messages_in,
                                          messages_out, throttled_requests)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
               ON CONFLICT (report_id) DO NOTHING""",
            r["report_id"],
            r["broker"],
            r["tenant"],
            r["minute"],
            r["requests_4k"],
            r["bytes_in"],
            r["bytes_out"],
            r["stored_bytes"],
            r["forced_deleted_messages"],
            r["tiered_bytes"],
            r["messages_in"],
            r["messages_out"],
            r["throttled_requests"],
        )
        inserted += done == "INSERT 0 1"
    return inserted


async def aggregate(
    conn: Connection, *, tenant_id: str, start: dt.datetime, end: dt.datetime, granularity: str
) -> list[Record]:
    assert granularity in ("minute", "hour")
    return await conn.fetch(
        """WITH per_broker AS (
               SELECT minute, broker, sum(requests_4k) AS r, sum(bytes_in) AS bi, sum(bytes_out) AS bo,
                      max(stored_bytes) AS sb, sum(forced_deleted_messages) AS fd, max(tiered_bytes) AS tb,
                      sum(messages_in) AS mi, sum(messages_out) AS mo, sum(throttled_requests) AS tr
               FROM usage_records WHERE tenant_id = $1 AND minute >= $2 AND minute < $3
               GROUP BY minute, broker),
           per_minute AS (
               SELECT minute, sum(r) AS r, sum(bi) AS bi, sum(bo) AS bo, sum(sb) AS sb, sum(fd) AS fd, sum(tb) AS tb,
                      sum(mi) AS mi, sum(mo) AS mo, sum(tr) AS tr
               FROM per_broker GROUP BY minute)
           SELECT date_trunc($4, minute) AS start, sum(r)::bigint AS requests_4k, sum(bi)::bigint AS bytes_in,
                  sum(bo)::bigint AS bytes_out, max(sb)::bigint AS stored_bytes,
                  sum(fd)::bigint AS forced_deleted_messages, max(tb)::bigint AS tiered_bytes,
                  sum(mi)::bigint AS messages_in, sum(mo)::bigint AS messages_out,
                  sum(tr)::bigint AS throttled_requests
           FROM per_minute GROUP BY 1 ORDER BY 1""",
        tenant_id,
        start,
        end,
        granularity,
    )
