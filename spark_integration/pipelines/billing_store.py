"""BillingStore: the metering pipeline's writes to PostgreSQL (tables of migrations 0004, 0009, 0010).

One micro-batch is one transaction:

    BEGIN; SET LOCAL timezone = 'UTC'
    pg_advisory_xact_lock(pipeline)           one writer per pipeline name at a time
    applied_offsets()                         per queue of the usage topic: the next offset not yet counted
    ... the caller drops what is below those offsets and aggregates the rest (Spark) ...
    add_minutes(), add_hours()                upserts that add counters (and keep gauges' maxima)
    raise_hour_peaks()                        an hour's stored_bytes_peak and tiered_bytes_peak ≥ each of
                                              its minutes' totals
    advance_offsets()                         the queues' next offsets, in the same transaction
    COMMIT

So the aggregates and the positions they cover move together: a micro-batch Spark runs again
(its commit did not reach the checkpoint), or a restart with a lost checkpoint that re-reads the
topic from its start, finds its records below the stored offsets and counts nothing twice.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from control_plane import db

T = TypeVar("T")

QueuePosition = tuple[str, str, int]  # (topic, broker, queue id)


def utc_ms(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


@dataclass(frozen=True, slots=True)
class MinuteRow:
    tenant: str
    minute_ms: int
    broker: str
    requests_4k: int
    bytes_in: int
    bytes_out: int
    stored_bytes: int  # the broker's largest sample in the minute (bytes on its disk)
    records: int
    tiered_bytes: int  # the broker's largest sample in the minute (bytes in object storage only)
    messages_in: int  # counters, summed like the first three
    messages_out: int
    throttled_requests: int


@dataclass(frozen=True, slots=True)
class HourRow:
    tenant: str
    hour_ms: int
    requests_4k: int
    bytes_in: int
    bytes_out: int
    records: int
    messages_in: int
    messages_out: int
    throttled_requests: int


def _minute_args(r: MinuteRow) -> tuple[Any, ...]:
    return (
        r.tenant, utc_ms(r.minute_ms), r.broker, r.requests_4k, r.bytes_in, r.bytes_out, r.stored_bytes, r.records,
        r.tiered_bytes, r.messages_in, r.messages_out, r.throttled_requests,
    )  # fmt: skip


def _hour_args(r: HourRow) -> tuple[Any, ...]:
    return (
        r.tenant, utc_ms(r.hour_ms), r.requests_4k, r.bytes_in, r.bytes_out, r.records, r.messages_in, r.messages_out,
        r.throttled_requests,
    )  # fmt: skip


class BillingStore:
    """A connection on a private event loop, driven synchronously from ``foreachBatch`` (which
    Spark calls on the driver, outside any event loop)."""

    def __init__(self, database_url: str, *, pipeline: str) -> None:
        self.pipeline = pipeline
        self._loop = asyncio.new_event_loop()
        try:
            self._conn: db.Connection = self._run(db.connect(database_url))
        except BaseException:
            self._loop.close()
            raise
        self._tx: Any = None

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coro)

    # --- the transaction ---------------------------------------------------------------------------
    def begin(self) -> dict[QueuePosition, int]:
        """Start the batch's transaction; the offsets already applied."""
        self._tx = self._conn.transaction()
        self._run(self._tx.__aenter__())
        self._run(self._conn.execute("SET LOCAL timezone = 'UTC'"))
        self._run(self._conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", "billing:" + self.pipeline))
        rows = self._run(
            self._conn.fetch(
                "SELECT topic, broker, queue_id, next_offset FROM billing_pipeline_offsets WHERE pipeline = $1",
                self.pipeline,
            )
        )
        return {(r["topic"], r["broker"], r["queue_id"]): r["next_offset"] for r in rows}

    def commit(self) -> None:
        tx, self._tx = self._tx, None
        self._run(tx.__aexit__(None, None, None))

    def rollback(self, exc: BaseException) -> None:
        tx, self._tx = self._tx, None
        if tx is not None:
            self._run(tx.__aexit__(type(exc), exc, exc.__traceback__))

    # --- writes (inside the transaction) -----------------------------------------------------------
    def add_minutes(self, rows: Sequence[MinuteRow]) -> None:
        if not rows:
            return
        self._run(
            self._conn.executemany(
                """INSERT INTO billing_usage_minute AS m
                       (tenant_id, minute, broker, requests_4k, bytes_in, bytes_out, stored_bytes, records,
                        tiered_bytes, messages_in, messages_out, throttled_requests)
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
                   ON CONFLICT (tenant_id, minute, broker) DO UPDATE SET
                       requests_4k = m.requests_4k + EXCLUDED.requests_4k,
                       bytes_in = m.bytes_in + EXCLUDED.bytes_in,
                       bytes_out = m.bytes_out + EXCLUDED.bytes_out,
                       messages_in = m.messages_in + EXCLUDED.messages_in,
                       messages_out = m.messages_out + EXCLUDED.messages_out,
                       throttled_requests = m.throttled_requests + EXCLUDED.throttled_requests,
                       stored_bytes = GREATEST(m.stored_bytes, EXCLUDED.stored_bytes),
                       tiered_bytes = GREATEST(m.tiered_bytes, EXCLUDED.tiered_bytes),
                       records = m.records + EXCLUDED.records,
                       updated_at = now()""",
                [_minute_args(r) for r in rows],
            )
        )

    def add_hours(self, rows: Sequence[HourRow]) -> None:
        if not rows:
            return
        self._run(
            self._conn.executemany(
                """INSERT INTO billing_usage_hour AS h
                       (tenant_id, hour, requests_4k, bytes_in, bytes_out, stored_bytes_peak, records, messages_in,
                        messages_out, throttled_requests)
                   VALUES ($1, $2, $3, $4, $5, 0, $6, $7, $8, $9)
                   ON CONFLICT (tenant_id, hour) DO UPDATE SET
                       requests_4k = h.requests_4k + EXCLUDED.requests_4k,
                       bytes_in = h.bytes_in + EXCLUDED.bytes_in,
                       bytes_out = h.bytes_out + EXCLUDED.bytes_out,
                       records = h.records + EXCLUDED.records,
                       messages_in = h.messages_in + EXCLUDED.messages_in,
                       messages_out = h.messages_out + EXCLUDED.messages_out,
                       throttled_requests = h.throttled_requests + EXCLUDED.throttled_requests,
                       updated_at = now()""",
                [_hour_args(r) for r in rows],
            )
        )

    def raise_hour_peaks(self, minutes: Sequence[MinuteRow]) -> None:
        """The hours of the minutes just written: each gauge's peak = max(peak, the minute's total
        over brokers)."""
        if not minutes:
            return
        touched = sorted({(r.tenant, utc_ms(r.minute_ms)) for r in minutes})
        self._run(
            self._conn.execute(
                """UPDATE billing_usage_hour h SET stored_bytes_peak = GREATEST(h.stored_bytes_peak, p.peak),
                                                  tiered_bytes_peak = GREATEST(h.tiered_bytes_peak, p.tiered_peak)
                   FROM (SELECT tenant_id, date_trunc('hour', minute) AS hour, max(total) AS peak,
                                max(tiered) AS tiered_peak
                         FROM (SELECT m.tenant_id, m.minute, sum(m.stored_bytes) AS total,
                                      sum(m.tiered_bytes) AS tiered
                               FROM billing_usage_minute m
                               JOIN unnest($1::text[], $2::timestamptz[]) AS t(tenant_id, minute)
                                 ON m.tenant_id = t.tenant_id AND m.minute = t.minute
                               GROUP BY m.tenant_id, m.minute) per_minute
                         GROUP BY tenant_id, date_trunc('hour', minute)) p
                   WHERE h.tenant_id = p.tenant_id AND h.hour = p.hour""",
                [t for t, _ in touched],
                [m for _, m in touched],
            )
        )

    def advance_offsets(self, next_offsets: dict[QueuePosition, int], batch_id: int) -> None:
        if not next_offsets:
            return
        self._run(
            self._conn.executemany(
                """INSERT INTO billing_pipeline_offsets AS o (pipeline, topic, broker, queue_id, next_offset, batch_id)
                   VALUES ($1, $2, $3, $4, $5, $6)
                   ON CONFLICT (pipeline, topic, broker, queue_id) DO UPDATE SET
                       next_offset = GREATEST(o.next_offset, EXCLUDED.next_offset),
                       batch_id = EXCLUDED.batch_id, updated_at = now()""",
                [(self.pipeline, t, b, q, n, batch_id) for (t, b, q), n in sorted(next_offsets.items())],
            )
        )

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(db.close(self._conn))
        finally:
            self._loop.close()
