"""The usage-metering pipeline end to end: an authenticating broker with ``usage_topic_enabled``
writes its usage records to ORBIT_SYS_USAGE (and still reports them over HTTP); the Spark job
(real Spark, the shared session) turns them into billing aggregates in a real PostgreSQL —
exactly once across a restart from its checkpoint and a restart with a lost checkpoint."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from control_plane import db
from data_plane.tenancy.usage_topic import USAGE_TOPIC
from spark_integration.pipelines import metering
from tests.integration.spark_support import SparkHandle, off_loop, spark_fixture  # noqa: F401
from tests.integration.tenancy_cluster import GROUP, TenancyCluster, tenancy_fixture, until  # noqa: F401
from tests.integration.test_tenancy_e2e_metering import BODY, sends
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(300)]

PIPELINE = "test-metering"
MINUTE_MS, HOUR_MS = 60_000, 3_600_000
SPARSE_COUNTERS = ("messages_in", "messages_out", "throttled_requests")


async def applied_offset(dsn: str) -> int:
    conn = await db.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT broker, queue_id, next_offset FROM billing_pipeline_offsets WHERE pipeline = $1", PIPELINE
        )
    finally:
        await db.close(conn)
    assert [(r["broker"], r["queue_id"]) for r in rows] == [(GROUP, 0)]  # the topic's one queue
    return int(rows[0]["next_offset"])


async def topic_records(spark: SparkHandle, tenancy: TenancyCluster, end: int) -> list[dict[str, Any]]:
    """The usage topic's messages [0, end), read back (batch) as the operator."""
    df = (
        spark.session.read.format("orbit")
        .option("namesrv", tenancy.namesrv.address)
        .option("topic", USAGE_TOPIC)
        .option("token", tenancy.cp.operator_token)
        .option("endingOffsets", orjson.dumps({USAGE_TOPIC: {f"{GROUP}:0": end}}).decode())
    )
    rows = await off_loop(spark, lambda: df.load().collect())
    assert sorted(r.queue_offset for r in rows) == list(range(end)), "the topic's prefix has a gap"
    return [orjson.loads(bytes(r.body)) for r in rows]


def expected_aggregates(records: list[dict[str, Any]]) -> tuple[dict[Any, list[int]], dict[Any, list[int]]]:
    """What billing_usage_minute and billing_usage_hour must hold, computed here record by record:
    [requests_4k, bytes_in, bytes_out, stored_bytes (peak), records, tiered_bytes (peak), messages_in,
    messages_out, throttled_requests]. A record without tiered_bytes (a broker without a tier) or
    without one of the last three counters (none counted) counts 0."""
    minutes: dict[Any, list[int]] = defaultdict(lambda: [0] * 9)
    for r in records:
        m = minutes[(r["tenant"], r["minute"] - r["minute"] % MINUTE_MS, r["broker"])]
        m[0] += r["requests_4k"]
        m[1] += r["bytes_in"]
        m[2] += r["bytes_out"]
        m[3] = max(m[3], r["stored_bytes"])
        m[4] += 1
        m[5] = max(m[5], r.get("tiered_bytes", 0))
        for i, f in enumerate(SPARSE_COUNTERS, start=6):
            m[i] += r.get(f, 0)
    totals: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])  # a tenant's minute: its brokers' gauges
    for (tenant, minute, _broker), m in minutes.items():
        totals[(tenant, minute)][0] += m[3]
        totals[(tenant, minute)][1] += m[5]
    hours: dict[Any, list[int]] = defaultdict(lambda: [0] * 9)
    for (tenant, minute, _broker), m in minutes.items():
        h = hours[(tenant, minute - minute % HOUR_MS)]
        for i in (0, 1, 2, 4, 6, 7, 8):
            h[i] += m[i]
        h[3] = max(h[3], totals[(tenant, minute)][0])
        h[5] = max(h[5], totals[(tenant, minute)][1])
    return dict(minutes), dict(hours)


async def billed(dsn: str) -> tuple[dict[Any, list[int]], dict[Any, list[int]]]:
    conn = await db.connect(dsn)
    try:
        minute_rows = await conn.fetch(
            """SELECT tenant_id, (extract(epoch FROM minute) * 1000)::bigint AS ms, broker,
                      requests_4k, bytes_in, bytes_out, stored_bytes, records, tiered_bytes, messages_in,
                      messages_out, throttled_requests
               FROM billing_usage_minute"""
        )
        hour_rows = await conn.fetch(
            """SELECT tenant_id, (extract(epoch FROM hour) * 1000)::bigint AS ms,
                      requests_4k, bytes_in, bytes_out, stored_bytes_peak, records, tiered_bytes_peak,
                      messages_in, messages_out, throttled_requests
               FROM billing_usage_hour"""
        )
    finally:
        await db.close(conn)
    minutes = {
        (r["tenant_id"], r["ms"], r["broker"]): [
            r["requests_4k"],
            r["bytes_in"],
            r["bytes_out"],
            r["stored_bytes"],
            r["records"],
            r["tiered_bytes"],
            *(r[f] for f in SPARSE_COUNTERS),
        ]
        for r in minute_rows
    }
    hours = {
        (r["tenant_id"], r["ms"]): [
            r["requests_4k"],
            r["bytes_in"],
            r["bytes_out"],
            r["stored_bytes_peak"],
            r["records"],
            r["tiered_bytes_peak"],
            *(r[f] for f in SPARSE_COUNTERS),
        ]
        for r in hour_rows
    }
    return minutes, hours


async def http_records(dsn: str) -> dict[str, dict[str, Any]]:
    """What the broker's HTTP reporter delivered to the control plane (its usage_records)."""
    conn = await db.connect(dsn)
    try:
        rows = await conn.fetch("SELECT report_id, requests_4k, bytes_in, bytes_out, stored_bytes FROM usage_records")
    finally:
        await db.close(conn)
    return {r["report_id"]: dict(r) for r in rows}


async def run_pipeline(spark: SparkHandle, opts: metering.MeteringOptions) -> None:
    query = await off_loop(spark, lambda: metering.start(spark.session, opts))
    finished = await off_loop(spark, lambda: query.awaitTermination(120))
    assert finished, "the AvailableNow metering run did not finish"


async def check_billing(spark: SparkHandle, tenancy: TenancyCluster, dsn: str) -> list[dict[str, Any]]:
    """The billing tables equal the aggregates of exactly the topic's records the pipeline applied."""
    end = await applied_offset(dsn)
    records = await topic_records(spark, tenancy, end)
    assert len({r["report_id"] for r in records}) == len(records)
    want_minutes, want_hours = expected_aggregates(records)
    got_minutes, got_hours = await billed(dsn)
    assert got_minutes == want_minutes
    assert got_hours == want_hours
    return records


async def test_metering_pipeline_bills_each_usage_record_once_across_restarts(
    spark: SparkHandle, tenancy: TenancyCluster, postgres_dsn: str, tmp_path: Path
) -> None:
    await tenancy.stop_broker()
    await tenancy.start_broker("--set", "usage_topic_enabled=true")
    await tenancy.reconciled()
    acme, globex = await tenancy.new_tenant("acme"), await tenancy.new_tenant("globex")
    for t in (acme, globex):
        await tenancy.create_topic(t, "orders")
    opts = metering.MeteringOptions(
        namesrv=tenancy.namesrv.address,
        database_url=postgres_dsn,
        checkpoint_dir=str(tmp_path / "checkpoint"),
        pipeline=PIPELINE,
        available_now=True,
        max_messages_per_trigger=25,  # several micro-batches per run
        source_options={"token": tenancy.cp.operator_token},
    )

    async def traffic(acme_sends: int, globex_sends: int) -> None:
        """Sends of BODY bytes; returns once the HTTP path has delivered their usage (by then the
        records are also in the topic: a roll spools, then publishes)."""
        now = await http_records(postgres_dsn)
        before = {t.id: sum(r["bytes_in"] for k, r in now.items() if k.endswith(f":{t.id}")) for t in (acme, globex)}
        await sends(tenancy, acme, acme_sends)
        await sends(tenancy, globex, globex_sends)

        async def delivered() -> bool:
            now = await http_records(postgres_dsn)
            got = {t: sum(r["bytes_in"] for k, r in now.items() if k.endswith(f":{t}")) for t in before}
            return got == {"acme": before["acme"] + acme_sends * BODY, "globex": before["globex"] + globex_sends * BODY}

        await until(delivered, "usage of the sends delivered over HTTP", timeout_s=30)

    await traffic(20, 7)
    await run_pipeline(spark, opts)
    first = await check_billing(spark, tenancy, postgres_dsn)
    billed_in = {t: sum(r["bytes_in"] for r in first if r["tenant"] == t) for t in ("acme", "globex")}
    assert billed_in == {"acme": 20 * BODY, "globex": 7 * BODY}
    messages_in = {t: sum(r.get("messages_in", 0) for r in first if r["tenant"] == t) for t in ("acme", "globex")}
    assert messages_in == {"acme": 20, "globex": 7}  # (and billed as check_billing compared)

    # A restart from the checkpoint picks up where the first run stopped.
    await traffic(5, 3)
    await run_pipeline(spark, opts)
    second = await check_billing(spark, tenancy, postgres_dsn)
    assert len(second) > len(first)
    billed_in = {t: sum(r["bytes_in"] for r in second if r["tenant"] == t) for t in ("acme", "globex")}
    assert billed_in == {"acme": 25 * BODY, "globex": 10 * BODY}

    # The checkpoint is lost: a new one reads the topic from its start, and counts nothing twice.
    fresh = dataclasses.replace(opts, checkpoint_dir=str(tmp_path / "new-checkpoint"))
    await run_pipeline(spark, fresh)
    third = await check_billing(spark, tenancy, postgres_dsn)
    assert len(third) >= len(second)
    billed_in = {t: sum(r["bytes_in"] for r in third if r["tenant"] == t) for t in ("acme", "globex")}
    assert billed_in == {"acme": 25 * BODY, "globex": 10 * BODY}

    # The topic carries the very records the HTTP reporter delivered.
    http = await http_records(postgres_dsn)

    async def all_delivered() -> bool:
        http.update(await http_records(postgres_dsn))
        return all(r["report_id"] in http for r in third)

    await until(all_delivered, "every record of the topic delivered over HTTP too", timeout_s=30)
    for r in third:
        assert {k: http[r["report_id"]][k] for k in ("requests_4k", "bytes_in", "bytes_out", "stored_bytes")} == {
            k: r[k] for k in ("requests_4k", "bytes_in", "bytes_out", "stored_bytes")
        }
