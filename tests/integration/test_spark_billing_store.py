"""spark_integration/pipelines/billing_store.py against a real PostgreSQL, without Spark: the
gauges of a micro-batch's minutes — bytes on brokers' disks and bytes in object storage only —
keep each broker's largest sample a minute and raise each hour's peak of their sum over brokers;
the counters (messages published and consumed, throttled requests) add up, also across batches."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from control_plane import db
from spark_integration.pipelines.billing_store import BillingStore, HourRow, MinuteRow
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = pytest.mark.integration

HOUR = 1_777_629_600_000  # 2026-05-01T10:00:00Z
MINUTE_MS = 60_000


def apply(dsn: str, minutes: list[MinuteRow], hours: list[HourRow]) -> None:
    """One micro-batch's writes, as BillingSink makes them."""
    store = BillingStore(dsn, pipeline="test")
    try:
        store.begin()
        store.add_minutes(minutes)
        store.add_hours(hours)
        store.raise_hour_peaks(minutes)
        store.commit()
    finally:
        store.close()


def rows(dsn: str, sql: str) -> list[dict[str, Any]]:
    async def fetch() -> list[dict[str, Any]]:
        conn = await db.connect(dsn)
        try:
            return [dict(r) for r in await conn.fetch(sql)]
        finally:
            await db.close(conn)

    return asyncio.run(fetch())


def minute(at_ms: int, broker: str, stored: int, tiered: int) -> MinuteRow:
    return MinuteRow("acme", at_ms, broker, 1, 10, 0, stored, 1, tiered, 0, 0, 0)


def test_tiered_bytes_peaks_like_stored_bytes(postgres_dsn: str) -> None:
    apply(
        postgres_dsn,
        [
            minute(HOUR, "broker-a", 100, 5000),
            minute(HOUR, "broker-b", 10, 700),
            minute(HOUR + MINUTE_MS, "broker-a", 300, 0),
        ],
        [HourRow("acme", HOUR, 3, 30, 0, 3, 0, 0, 0)],
    )
    # A later batch with another sample of the first minute: a broker's largest sample stays.
    apply(postgres_dsn, [minute(HOUR, "broker-a", 50, 6000)], [HourRow("acme", HOUR, 1, 10, 0, 1, 0, 0, 0)])
    got = rows(
        postgres_dsn,
        "SELECT broker, stored_bytes, tiered_bytes, records FROM billing_usage_minute ORDER BY minute, broker",
    )
    assert [(r["broker"], r["stored_bytes"], r["tiered_bytes"], r["records"]) for r in got] == [
        ("broker-a", 100, 6000, 2),
        ("broker-b", 10, 700, 1),
        ("broker-a", 300, 0, 1),
    ]
    (hour,) = rows(postgres_dsn, "SELECT stored_bytes_peak, tiered_bytes_peak, records FROM billing_usage_hour")
    # The hour's peaks: each gauge's largest minute, summed over brokers (110 and 6700 at 10:00,
    # 300 and 0 at 10:01) — each on its own.
    assert (hour["stored_bytes_peak"], hour["tiered_bytes_peak"], hour["records"]) == (300, 6700, 4)


def test_message_counts_and_throttled_requests_add_up_per_minute_and_hour(postgres_dsn: str) -> None:
    def counted(at_ms: int, broker: str, messages_in: int, messages_out: int, throttled: int) -> MinuteRow:
        return MinuteRow("acme", at_ms, broker, 1, 10, 0, 0, 1, 0, messages_in, messages_out, throttled)

    apply(
        postgres_dsn,
        [counted(HOUR, "broker-a", 10, 4, 2), counted(HOUR, "broker-b", 1, 20, 0)],
        [HourRow("acme", HOUR, 2, 20, 0, 2, 11, 24, 2)],
    )
    # A later batch with more of the first minute (and hour): the counters add up.
    apply(postgres_dsn, [counted(HOUR, "broker-a", 5, 0, 3)], [HourRow("acme", HOUR, 1, 10, 0, 1, 5, 0, 3)])
    got = rows(
        postgres_dsn,
        "SELECT broker, messages_in, messages_out, throttled_requests FROM billing_usage_minute ORDER BY broker",
    )
    assert [(r["broker"], r["messages_in"], r["messages_out"], r["throttled_requests"]) for r in got] == [
        ("broker-a", 15, 4, 5),
        ("broker-b", 1, 20, 0),
    ]
    (hour,) = rows(
        postgres_dsn, "SELECT messages_in, messages_out, throttled_requests, records FROM billing_usage_hour"
    )
    assert (hour["messages_in"], hour["messages_out"], hour["throttled_requests"], hour["records"]) == (16, 24, 5, 3)
