"""Usage: records reported by brokers (idempotent on report_id) and their aggregates."""

from __future__ import annotations

import datetime as dt
from typing import Any

from control_plane.db import Pool
from control_plane.repositories import tenants as tenants_repo
from control_plane.repositories import usage as repo

MAX_RANGE = {"minute": dt.timedelta(days=2), "hour": dt.timedelta(days=93)}
# Counters add up: requests_4k, bytes_in, bytes_out, forced_deleted_messages — messages a broker
# deleted inside their retention at its disk's emergency watermark (docs/store.md, "Retention") —,
# messages_in (published messages stored), messages_out (messages delivered to consumers) and
# throttled_requests (requests refused for a quota or limit).
# Gauges: stored_bytes, a tenant's bytes on brokers' disks, and tiered_bytes, its bytes in object
# storage only (brokers without a tier report none); totals show each one's largest bucket.
USAGE_FIELDS = (
    "requests_4k",
    "bytes_in",
    "bytes_out",
    "stored_bytes",
    "forced_deleted_messages",
    "tiered_bytes",
    "messages_in",
    "messages_out",
    "throttled_requests",
)
GAUGES = ("stored_bytes", "tiered_bytes")


class UsageService:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def ingest(self, records: list[dict[str, Any]]) -> dict[str, int]:
        """Store a batch in one transaction; ``duplicates`` counts records seen before."""
        async with self.pool.acquire() as conn, conn.transaction():
            accepted = await repo.insert_records(conn, records)
        return {"accepted": accepted, "duplicates": len(records) - accepted}

    async def usage(self, *, tenant_id: str, start: dt.datetime, end: dt.datetime, granularity: str) -> dict[str, Any]:
        async with self.pool.acquire() as conn:
            await tenants_repo.get_tenant(conn, tenant_id=tenant_id)
            rows = await repo.aggregate(conn, tenant_id=tenant_id, start=start, end=end, granularity=granularity)
        buckets = [{"start": r["start"].isoformat(), **{f: int(r[f]) for f in USAGE_FIELDS}} for r in rows]
        totals = {f: sum(b[f] for b in buckets) for f in USAGE_FIELDS if f not in GAUGES}
        totals.update({f"{f}_max": max((b[f] for b in buckets), default=0) for f in GAUGES})
        return {
            "tenant_id": tenant_id,
            "from": start.isoformat(),
            "to": end.isoformat(),
            "granularity": granularity,
            "buckets": buckets,
            "totals": totals,
        }
